// `seqlab op NAME --in DIR --out DIR`: runs one registered op on .npy files, for interop with NumPy
// and PyTorch and for debugging one op in isolation. Inputs are DIR/<input>.npy; cotangents
// DIR/grad_<output>.npy, when present, make it run the backward too and write grad_<input>.npy.
//
// Everything is read, checked and computed before the first file is written, so a failure leaves
// the output folder as it was; each file itself is written atomically by write_npy.
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_replace.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <stdexcept>
#include <utility>

#include "autograd/op_registry.h"
#include "autograd/variable.h"
#include "tensor/kernels.h"
#include "tensor/npy.h"
#include "train/cli/commands.h"
#include "train/recipe/edit_distance.h"

namespace seqlab::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kOpUsage[] =
    "usage: seqlab op NAME --in DIR --out DIR [--attr key=value]... [--dtype f32|f64]\n"
    "       seqlab op --list | seqlab op NAME --help\n"
    "\n"
    "Runs op NAME on DIR/<input>.npy (floating inputs f32 or f64, index inputs i32 or i64, masks any\n"
    "dtype; optional inputs may be absent) and writes <output>.npy into the --out folder. When\n"
    "DIR/grad_<output>.npy files are present it also runs the backward (absent cotangents are zeros)\n"
    "and writes grad_<input>.npy for every floating input.\n"
    "\n"
    "  --in DIR          folder holding the input .npy files\n"
    "  --out DIR         folder for the results (created if missing)\n"
    "  --attr key=value  an attribute of the op (repeatable); see --list for names and defaults\n"
    "  --dtype f32|f64   convert floating inputs to this dtype (default: theirs, which must agree)\n"
    "  --list            the registered ops, one JSON object per line\n";

struct OpArgs {
  std::string name;
  std::string in_dir, out_dir;
  std::map<std::string, std::string> attrs;
  std::string dtype;  // empty: the floating inputs' own
  bool list = false, help = false;
};

OpArgs parse_args(const std::vector<std::string>& args) {
  OpArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!absl::StartsWith(arg, "-")) {
      if (!a.name.empty()) throw UserError("unexpected argument '" + arg + "' (the op is already '" + a.name + "')");
      a.name = arg;
      continue;
    }
    // Both `--flag value` and `--flag=value`.
    size_t eq = arg.find('=');
    std::string flag = arg.substr(0, eq);
    auto value = [&]() -> std::string {
      if (eq != std::string::npos) return arg.substr(eq + 1);
      if (i + 1 >= args.size() || absl::StartsWith(args[i + 1], "--")) throw UserError(flag + " needs a value");
      return args[++i];
    };
    if (flag == "--list" || flag == "--help" || flag == "-h") {
      if (eq != std::string::npos) throw UserError(flag + " takes no value");
      (flag == "--list" ? a.list : a.help) = true;
    } else if (flag == "--in") {
      a.in_dir = value();
    } else if (flag == "--out") {
      a.out_dir = value();
    } else if (flag == "--dtype") {
      a.dtype = value();
      if (a.dtype != "f32" && a.dtype != "f64") throw UserError("--dtype must be f32 or f64, not '" + a.dtype + "'");
    } else if (flag == "--attr") {
      std::string kv = value();
      size_t at = kv.find('=');
      if (at == std::string::npos || at == 0) throw UserError("--attr expects key=value, got '" + kv + "'");
      if (!a.attrs.emplace(kv.substr(0, at), kv.substr(at + 1)).second) {
        throw UserError("attribute '" + kv.substr(0, at) + "' given twice");
      }
    } else {
      throw UserError("unknown flag '" + flag + "' (see seqlab op --help)");
    }
  }
  return a;
}

const OpSpec& find_op_or_suggest(const std::string& name) {
  if (const OpSpec* op = find_op(name)) return *op;
  const OpSpec* nearest = nullptr;
  size_t best = std::string::npos;
  for (const OpSpec& op : registered_ops()) {
    size_t d = edit_distance(name, op.name);
    if (d < best) best = d, nearest = &op;
  }
  std::string hint = nearest && best <= std::max<size_t>(2, name.size() / 3)
                         ? "did you mean '" + nearest->name + "'? "
                         : "";
  throw UserError("unknown op '" + name + "' (" + hint + "seqlab op --list shows them all)");
}

Tensor read_file(const std::string& path) {
  absl::StatusOr<Tensor> t = read_npy(path);
  if (!t.ok()) throw UserError(std::string(t.status().message()));
  return *std::move(t);
}

std::string input_names(const OpSpec& op) {
  std::vector<std::string> names;
  for (const OpInputSpec& in : op.inputs) names.push_back(in.name + (in.optional ? ".npy (optional)" : ".npy"));
  return absl::StrJoin(names, ", ");
}

// Reads DIR/<input>.npy for every input and checks its dtype against the input's kind.
std::vector<Tensor> read_inputs(const OpSpec& op, const fs::path& dir) {
  std::vector<Tensor> inputs;
  for (const OpInputSpec& in : op.inputs) {
    std::string path = (dir / (in.name + ".npy")).string();
    if (!fs::exists(path)) {
      if (!in.optional) throw UserError("missing input " + path + " (op " + op.name + " takes " + input_names(op) + ")");
      inputs.emplace_back();
      continue;
    }
    Tensor t = read_file(path);
    DType d = t.dtype();
    if (in.kind == OpInputKind::floating && d != DType::f32 && d != DType::f64) {
      throw UserError(path + ": input " + in.name + " must be f32 or f64, not " + dtype_name(d));
    }
    if (in.kind == OpInputKind::index && !is_integer(d)) {
      throw UserError(path + ": input " + in.name + " holds indices and must be i32 or i64, not " + dtype_name(d));
    }
    inputs.push_back(t);
  }
  return inputs;
}

// The dtype the op runs in: --dtype, else the one all floating inputs share.
DType compute_dtype(const OpSpec& op, const std::vector<Tensor>& inputs, const std::string& requested) {
  if (!requested.empty()) return requested == "f64" ? DType::f64 : DType::f32;
  std::string first;
  DType dtype = DType::f32;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (op.inputs[i].kind != OpInputKind::floating || !inputs[i].defined()) continue;
    if (first.empty()) {
      first = op.inputs[i].name;
      dtype = inputs[i].dtype();
    } else if (inputs[i].dtype() != dtype) {
      throw UserError(absl::StrCat("floating inputs disagree: ", first, " is ", dtype_name(dtype), ", ",
                                   op.inputs[i].name, " is ", dtype_name(inputs[i].dtype()),
                                   " (pass --dtype f32 or --dtype f64 to convert)"));
    }
  }
  return dtype;
}

// DIR/grad_<output>.npy per output, undefined where absent.
std::vector<Tensor> read_cotangents(const OpSpec& op, const fs::path& dir, DType dtype) {
  std::vector<Tensor> grads;
  for (const std::string& out : op.outputs) {
    std::string path = (dir / ("grad_" + out + ".npy")).string();
    if (!fs::exists(path)) {
      grads.emplace_back();
      continue;
    }
    Tensor g = read_file(path);
    if (!is_floating(g.dtype())) throw UserError(path + ": a cotangent must be f32 or f64, not " + dtype_name(g.dtype()));
    grads.push_back(kernel::to_dtype(g, dtype));
  }
  return grads;
}

// Runs the forward (and the backward when cotangents are given); returns file name → tensor.
std::vector<std::pair<std::string, Tensor>> compute(const OpSpec& op, const OpAttrs& attrs, std::vector<Tensor> inputs,
                                                    const std::vector<Tensor>& cotangents, const fs::path& in_dir) {
  bool run_backward = std::any_of(cotangents.begin(), cotangents.end(), [](const Tensor& t) { return t.defined(); });
  std::vector<size_t> floating;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (op.inputs[i].kind == OpInputKind::floating && inputs[i].defined()) floating.push_back(i);
  }
  if (run_backward) {
    for (size_t i : floating) set_requires_grad(inputs[i], true);
  }
  std::vector<Tensor> outputs = op.forward(inputs, attrs);
  if (outputs.size() != op.outputs.size()) {
    throw std::logic_error(absl::StrCat("op ", op.name, " returned ", outputs.size(), " outputs for ", op.outputs.size(),
                                        " declared"));
  }
  std::vector<std::pair<std::string, Tensor>> results;
  for (size_t o = 0; o < outputs.size(); ++o) results.emplace_back(op.outputs[o] + ".npy", outputs[o]);
  if (!run_backward) return results;

  std::vector<Tensor> roots, grads;
  for (size_t o = 0; o < outputs.size(); ++o) {
    const Tensor& g = cotangents[o];
    if (g.defined() && g.shape() != outputs[o].shape()) {
      throw UserError(absl::StrCat((in_dir / ("grad_" + op.outputs[o] + ".npy")).string(), " has shape ",
                                   shape_str(g.shape()), " but output ", op.outputs[o], " has shape ",
                                   shape_str(outputs[o].shape())));
    }
    if (!requires_grad(outputs[o])) continue;  // depends on no floating input
    roots.push_back(outputs[o]);
    grads.push_back(g.defined() ? g : Tensor::zeros(outputs[o].shape(), outputs[o].dtype()));
  }
  if (!roots.empty()) backward(roots, grads);
  for (size_t i : floating) {
    Tensor g = grad_of(inputs[i]);
    if (!g.defined()) g = Tensor::zeros(inputs[i].shape(), inputs[i].dtype());  // no output depends on it
    results.emplace_back("grad_" + op.inputs[i].name + ".npy", g);
  }
  return results;
}

// Writes every result; if one write fails, removes the ones this run wrote.
void write_results(const fs::path& dir, const std::vector<std::pair<std::string, Tensor>>& results) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError("cannot create the output folder " + dir.string() + ": " + ec.message());
  std::vector<fs::path> written;
  for (const auto& [file, tensor] : results) {
    absl::Status s = write_npy((dir / file).string(), tensor);
    if (!s.ok()) {
      for (const fs::path& p : written) fs::remove(p, ec);
      throw UserError(std::string(s.message()));
    }
    written.push_back(dir / file);
  }
}

void run(const OpArgs& a) {
  if (a.name.empty()) throw UserError("no op named (usage: seqlab op NAME --in DIR --out DIR; see seqlab op --help)");
  const OpSpec& op = find_op_or_suggest(a.name);
  if (a.in_dir.empty()) throw UserError("--in DIR is required (the folder holding " + input_names(op) + ")");
  if (a.out_dir.empty()) throw UserError("--out DIR is required");
  if (!fs::is_directory(a.in_dir)) throw UserError("input folder '" + a.in_dir + "' does not exist");
  OpAttrs attrs;
  try {
    attrs = OpAttrs::parse(op.name, op.attrs, a.attrs);
  } catch (const std::invalid_argument& e) {
    throw UserError(e.what());
  }
  std::vector<Tensor> inputs = read_inputs(op, a.in_dir);
  DType dtype = compute_dtype(op, inputs, a.dtype);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (op.inputs[i].kind == OpInputKind::floating && inputs[i].defined()) inputs[i] = kernel::to_dtype(inputs[i], dtype);
  }
  std::vector<Tensor> cotangents = read_cotangents(op, a.in_dir, dtype);
  std::vector<std::pair<std::string, Tensor>> results;
  try {
    results = compute(op, attrs, std::move(inputs), cotangents, a.in_dir);
  } catch (const std::invalid_argument& e) {  // the op's own checks: shapes, index ranges, attributes
    throw UserError("op " + op.name + ": " + e.what());
  } catch (const std::out_of_range& e) {
    throw UserError("op " + op.name + ": " + e.what());
  }
  write_results(a.out_dir, results);
}

const char* kind_name(OpInputKind k) {
  switch (k) {
    case OpInputKind::floating: return "f32 or f64";
    case OpInputKind::index: return "i32 or i64 indices";
    case OpInputKind::mask: return "mask, any dtype, nonzero = set";
  }
  return "?";
}

// `seqlab op NAME --help`: what one op computes, takes and returns.
void print_op_help(const OpSpec& op) {
  std::cout << op.name << ": " << op.summary << "\ninputs (from --in DIR):\n";
  for (const OpInputSpec& in : op.inputs) {
    std::cout << "  " << in.name << ".npy  " << kind_name(in.kind) << (in.optional ? ", optional" : "") << "\n";
  }
  std::cout << "outputs: " << absl::StrJoin(op.outputs, ".npy, ") << ".npy\nattributes (--attr key=value):\n";
  if (op.attrs.empty()) std::cout << "  none\n";
  for (const OpAttrSpec& at : op.attrs) {
    std::cout << "  " << at.name << "=" << at.default_value << (at.help.empty() ? "" : "  " + at.help) << "\n";
  }
}

void report(const std::string& message) {
  std::cerr << "seqlab op: " << absl::StrReplaceAll(message, {{"\n", " "}}) << "\n";
}

}  // namespace

int op_command(const std::vector<std::string>& args) {
  try {
    OpArgs a = parse_args(args);
    if (a.help && !a.name.empty()) {
      print_op_help(find_op_or_suggest(a.name));
    } else if (a.help) {
      std::cout << kOpUsage;
    } else if (a.list) {
      for (const OpSpec& op : registered_ops()) std::cout << op_spec_json(op) << "\n";
    } else {
      run(a);
    }
    return 0;
  } catch (const UserError& e) {
    report(e.what());
    return kUsageError;
  } catch (const std::exception& e) {  // a broken invariant inside seqlab, not the user's doing
    report(std::string("internal error: ") + e.what());
    return 1;
  }
}

}  // namespace seqlab::cli
