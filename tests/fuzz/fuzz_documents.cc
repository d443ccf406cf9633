// Corpus files (train/data/documents.h) as `data.source = "text"` reads them, and a prepared dataset's
// meta.json (train/data/prepare.h): the input is read as a JSONL file, as a text file, as a fortunes
// file, and as meta.json. Every document read is non-blank.
#include "fuzz_util.h"
#include "train/data/prepare.h"

namespace {

void check_documents(const seqlab::DocSource& source) {
  absl::StatusOr<std::vector<std::string>> docs = seqlab::read_documents(source);
  if (!docs.ok()) return;
  for (const std::string& doc : *docs) {
    FUZZ_CHECK(doc.find_first_not_of(" \t\r\n\v\f") != std::string::npos, "a blank document was read");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace seqlab;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  check_documents({fuzz::write_scratch("docs.jsonl", input), DocFormat::jsonl, "text"});
  check_documents({fuzz::write_scratch("docs.txt", input), DocFormat::text, "text"});
  check_documents({fuzz::write_scratch("docs.fortune", input), DocFormat::fortune, "text"});
  check_documents({fuzz::scratch_dir().string() + "/docs.txt", DocFormat::automatic, "text"});

  std::filesystem::create_directories(fuzz::scratch_dir() / "dataset");
  fuzz::write_scratch("dataset/meta.json", input);
  (void)read_dataset_info((fuzz::scratch_dir() / "dataset").string());
  return 0;
}
