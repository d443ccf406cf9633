#!/usr/bin/env python3
"""The layering rule of docs/design.md, checked on every source file, and shown to bite.

A folder of src/ includes only from itself and the folders below it:

    tensor    <- autograd <- dist <- layers <- train
    cuda      implements tensor's slots: it includes tensor and itself, nothing above

and src/tensor/cpu/ is private to src/tensor (ops use the public helpers tensor/parallel.h and
tensor/blas_rows.h). Inside src/train the sub-folders are layered the same way, bottom to top:

    common <- data <- optim <- recipe <- checkpoint <- export <- launch <- loop <- sweep <- cli

(a file of src/train/X/ includes from src/train/Y/ only when Y is X or below it; nothing includes
cli). Every quoted #include of every .h, .cpp, .cu and .cuh under src/ must name a file of src/ (or
the generated build_info.h, for src/train) by its path from src/, never with "..".

The test then shows that the rule is enforced, twice:
  1. it copies src/ into a scratch folder, adds `#include "layers/module.h"` to tensor/tensor.h (and,
     in other copies, to dist/communicator.h, and `#include "train/cli/util.h"` to
     train/data/loader.h), and expects this checker to reject each copy, naming that file and line;
  2. with the compiler and the build's include views (build/include_views/, one per library), it
     compiles a file that includes upward and expects the compiler to refuse it, and one that
     includes only allowed folders and expects it to compile.

Usage: layering_test.py SOURCE_DIR [CXX VIEW_ROOT]   (CTest passes all three)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Which top folders of src/ each folder may include.
ALLOWED = {
    "tensor": {"tensor"},
    "cuda": {"tensor", "cuda"},
    "autograd": {"tensor", "autograd"},
    "dist": {"tensor", "autograd", "dist"},
    "layers": {"tensor", "autograd", "dist", "layers"},
    "train": {"tensor", "autograd", "dist", "layers", "train"},
}
# The sub-folders of src/train, bottom to top: each includes only from itself and those before it.
TRAIN_ORDER = ["common", "data", "optim", "recipe", "checkpoint", "export", "launch", "loop", "sweep", "cli"]
GENERATED = {"build_info.h": {"train"}}  # generated headers, and the folders that may include them
SOURCE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def train_rank(rel):
    """The position in TRAIN_ORDER of the sub-folder of src/train that `rel` (a path from src/) is in,
    or None when it is in none of them."""
    parts = rel.split("/")
    if len(parts) < 3 or parts[0] != "train" or parts[1] not in TRAIN_ORDER:
        return None
    return TRAIN_ORDER.index(parts[1])


def violations(src):
    """Every broken rule under `src`, as 'FILE:LINE: message' strings."""
    found = []
    for root, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src)
            folder = rel.split(os.sep)[0]
            if folder not in ALLOWED:
                found.append(f"{rel}: src/{folder}/ is not a layer of docs/design.md")
                continue
            rank = None
            if folder == "train":
                rank = train_rank(rel.replace(os.sep, "/"))
                if rank is None:
                    found.append(f"{rel}: not in a sub-folder of src/train of docs/design.md "
                                 f"({', '.join(TRAIN_ORDER)})")
                    continue
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = m.group(1)
                    where = f"{rel}:{number}"
                    if target in GENERATED:
                        if folder not in GENERATED[target]:
                            found.append(f"{where}: src/{folder}/ includes the generated {target}")
                        continue
                    if ".." in target.split("/"):
                        found.append(f'{where}: "{target}" climbs with ..; name the file by its path from src/')
                        continue
                    top = target.split("/")[0]
                    if not os.path.isfile(os.path.join(src, target)):
                        found.append(f'{where}: "{target}" is not a file of src/ (paths are written from src/)')
                    elif top not in ALLOWED[folder]:
                        found.append(f'{where}: src/{folder}/ includes "{target}" from src/{top}/, a layer above it')
                    elif target.startswith("tensor/cpu/") and not rel.startswith("tensor" + os.sep):
                        found.append(f'{where}: "{target}" is private to src/tensor (use tensor/parallel.h, '
                                     "tensor/blas_rows.h)")
                    elif rank is not None and top == "train":
                        target_rank = train_rank(target)
                        sub, target_sub = TRAIN_ORDER[rank], target.split("/")[1]
                        if target_rank is None:
                            found.append(f'{where}: "{target}" is not in a sub-folder of src/train')
                        elif target_rank > rank:
                            found.append(f'{where}: src/train/{sub}/ includes "{target}" from '
                                         f"src/train/{target_sub}/, a layer above it")
    return found


def check_tree(src):
    found = violations(src)
    for v in found:
        print("layering:", v)
    return not found


def checker_rejects_an_upward_include(src, folder="tensor", name="tensor.h", target="layers/module.h"):
    """A copy of src/ with FOLDER/NAME including TARGET (from a layer above FOLDER) must fail, naming the
    line."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = os.path.join(scratch, "src")
        shutil.copytree(src, copy)
        header = os.path.join(copy, folder, name)
        with open(header, encoding="utf-8") as f:
            lines = f.readlines()
        at = next(i for i, line in enumerate(lines) if INCLUDE.match(line))
        lines.insert(at, f'#include "{target}"\n')
        with open(header, "w", encoding="utf-8") as f:
            f.writelines(lines)
        found = violations(copy)
    target_folder = os.path.dirname(target)
    expected = (f'{folder}/{name}:{at + 1}: src/{folder}/ includes "{target}" from src/{target_folder}/, '
                "a layer above it")
    if found != [expected]:
        print("layering: the checker did not reject exactly the added upward include; it reported:", found)
        return False
    print("layering: an added upward include is rejected:", expected)
    return True


def compiler_refuses_an_upward_include(cxx, views):
    """Through the tensor library's include view an include of autograd/ must not compile."""
    def compiles(view, text):
        with tempfile.TemporaryDirectory() as scratch:
            source = os.path.join(scratch, "probe.cpp")
            with open(source, "w", encoding="utf-8") as f:
                f.write(text)
            r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-I", os.path.join(views, view), source],
                               capture_output=True, text=True, cwd=scratch)
            return r.returncode == 0, r.stderr
    ok, err = compiles("tensor", '#include "tensor/tensor.h"\nint main() { return 0; }\n')
    if not ok:
        print("layering: a tensor-only include did not compile through the tensor view:\n" + err)
        return False
    ok, _ = compiles("tensor", '#include "autograd/variable.h"\nint main() { return 0; }\n')
    if ok:
        print("layering: an include of autograd/ compiled through the tensor library's include view")
        return False
    ok, _ = compiles("cuda", '#include "layers/module.h"\nint main() { return 0; }\n')
    if ok:
        print("layering: an include of layers/ compiled through the cuda library's include view")
        return False
    ok, err = compiles("dist", '#include "dist/communicator.h"\nint main() { return 0; }\n')
    if not ok:
        print("layering: a dist include did not compile through the dist view:\n" + err)
        return False
    ok, _ = compiles("dist", '#include "layers/module.h"\nint main() { return 0; }\n')
    if ok:
        print("layering: an include of layers/ compiled through the dist library's include view")
        return False
    print("layering: through the libraries' include views, upward includes do not compile")
    return True


def main():
    if len(sys.argv) not in (2, 4):
        print(__doc__)
        return 2
    src = os.path.join(sys.argv[1], "src")
    ok = check_tree(src)
    if ok:
        print("layering: every include of src/ follows the rule")
    ok = checker_rejects_an_upward_include(src) and ok
    ok = checker_rejects_an_upward_include(src, "dist", "communicator.h") and ok
    ok = checker_rejects_an_upward_include(src, "train/data", "loader.h", "train/cli/util.h") and ok
    if len(sys.argv) == 4:
        ok = compiler_refuses_an_upward_include(sys.argv[2], os.path.abspath(sys.argv[3])) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
