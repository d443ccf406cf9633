// `prepare`: documents -> token shards with a train/val split.
//
// The documents of a source (documents.h) are divided between train and val as wholes: exactly
// round(n × val_fraction) documents (at least one when val_fraction > 0) go to val, picked by a shuffle
// seeded by `seed`; each split keeps the source order. Each document is tokenised and preceded by the
// end-of-text token (as llm.c's GPT-2 data does), so a split's stream reads
//   eot doc0 eot doc1 eot doc2 ...
// and is cut into <out>/train_000000.bin, train_000001.bin, ... and val_000000.bin, ... of at most
// `shard_tokens` tokens. <out>/meta.json, written last, records the tokenizer, the counts and the source;
// its presence marks a complete folder.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include "train/data/documents.h"
#include "train/data/tokenizer.h"

namespace seqlab {

struct PrepareOptions {
  DocSource source{kDefaultCorpus, DocFormat::fortune, "text"};
  std::string tokenizer = "byte";  // "byte" or "bpe"
  std::string tokenizer_path;      // the merges file, for "bpe"
  double val_fraction = 0.05;
  uint64_t seed = 0;
  int64_t shard_tokens = 100'000'000;
};

// The contents of meta.json.
struct DatasetInfo {
  std::string dir;
  std::string tokenizer, tokenizer_path;
  int64_t vocab_size = 0, eot = 0;
  std::string source, source_format;
  double val_fraction = 0;
  uint64_t seed = 0;
  int64_t train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t train_shards = 0, val_shards = 0;
};

// Which documents go to val: exactly round(n × val_fraction) of n (at least 1 when val_fraction > 0),
// the same for the same (n, val_fraction, seed). Errors when val_fraction is outside [0, 1) or the
// split would leave train or val empty.
absl::StatusOr<std::vector<bool>> split_documents(int64_t n, double val_fraction, uint64_t seed);

// Reads, tokenises and writes the shards and meta.json into `out_dir` (created if missing; shards of an
// earlier prepare there are replaced).
absl::StatusOr<DatasetInfo> prepare_dataset(const PrepareOptions& options, const std::string& out_dir);

// What the training loop calls: the prepared folder under `cache_root` for these options, preparing it
// first when it is missing. The folder name carries a hash of the input files (path, size, mtime), the
// format and field, the tokenizer (and its merges file's contents), val_fraction, seed and shard size,
// so changing any of them prepares anew. Concurrent callers each prepare into a temporary folder and the
// first rename wins; the others use the winner's. Temporary folders of prepares killed midway (their
// process gone) are removed first (remove_dead_temporaries).
absl::StatusOr<DatasetInfo> prepare_cached(const PrepareOptions& options, const std::string& cache_root);

// meta.json of a prepared folder. Every number is checked against its range (vocab_size in [1, 65536],
// eot below it, counts ≥ 0), so a corrupt file is refused, naming the file and the field, before
// anything is sized by it.
absl::StatusOr<DatasetInfo> read_dataset_info(const std::string& dir);

// GPT-2's vocabulary, the ids of llm.c's shards unless a recipe says otherwise.
constexpr int64_t kGpt2VocabSize = 50257;

// The folder that data.source = "shards" names, whichever tool wrote it:
// - with meta.json (seqlab's prepare): read_dataset_info. `vocab_size`, when not 0, must equal its
//   vocab_size, and `tokenizer_path`, when given, its tokenizer_path (meta.json names the tokenizer);
// - without (llm.c's own shards, <name>_train_NNNNNN.bin and <name>_val_NNNNNN.bin): train and val are
//   the shards whose names hold those words (find_shards); the vocabulary is `vocab_size`, else the
//   number of tokens of the tokenizer file, else GPT-2's 50257. The tokenizer is "llmc" when
//   `tokenizer_path` names llm.c's tokenizer file (told by its magic; anything else is refused), else
//   "ids" (samples print token ids). Of DatasetInfo, dir, tokenizer, tokenizer_path, vocab_size, eot,
//   source_format ("llm.c") and the shard counts are filled; the rest stays 0.
absl::StatusOr<DatasetInfo> open_shard_folder(const std::string& dir, int64_t vocab_size,
                                              const std::string& tokenizer_path);

// The decoder of a folder's ids (make_decoder of its tokenizer); an error when its vocabulary is not
// the folder's. With another table than lm's, the folder's byte or BPE tokenizer with that table
// (open_tokenizer).
absl::StatusOr<std::unique_ptr<TokenDecoder>> open_decoder(const DatasetInfo& info,
                                                           const SpecialTokens& table = special_tokens(Objective::lm));
// The byte or BPE tokenizer of a folder seqlab prepared, with the special tokens `table` after its text
// ids (special_tokens.h). Errors: a folder of llm.c's shards (its tokenizer cannot take other special
// tokens), and a tokenizer whose lm vocabulary or end-of-text is not the folder's (meta.json).
absl::StatusOr<std::unique_ptr<Tokenizer>> open_tokenizer(const DatasetInfo& info, const SpecialTokens& table);

}  // namespace seqlab
