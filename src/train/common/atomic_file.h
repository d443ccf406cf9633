// Files replaced atomically: written under a temporary name next to the file, flushed, fsynced and
// renamed over it, so that a kill at any moment leaves the old file or the new one, never a mix. The
// temporary is FILE.tmp.PID, which tells whose it is: a run folder removes those whose writer is gone
// (remove_leftover_temporaries, checkpoint/run_folder.h). In common/ because recipe/ writes a run's
// recipe.toml so, below checkpoint/, as do the folders above it.
#pragma once

#include <string>

#include <absl/status/status.h>

namespace seqlab::cli {  // the namespace of src/train's shared helpers (errors.h says why)

// "FILE.tmp.PID" for a temporary written by this process next to FILE.
std::string temporary_name(const std::string& file);

// Replaces `path` by `text` atomically: written to temporary_name(path), flushed, fsynced, renamed.
// A kill at any moment leaves the old file or the new one, never a mix; an error (the disk full, the
// folder not writable) leaves the old file and no temporary, and names the file and the reason.
absl::Status write_file_atomically(const std::string& path, const std::string& text);

}  // namespace seqlab::cli
