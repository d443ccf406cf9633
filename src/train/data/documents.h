// Documents: the units a corpus is cut into before tokenisation (joined with end-of-text, split between
// train and val as wholes). A source is one file or a folder of files in one of three formats:
//
//   text      documents are paragraphs, separated by one or more blank lines (a single text file such
//             as a book still gets a train/val split)
//   fortune   documents are separated by lines holding only "%" (Debian's fortunes files)
//   jsonl     one JSON object per line; the document is its string field `json_field` ("text")
//   auto      guessed per file: jsonl for *.jsonl and *.json, fortune when a line holds only "%",
//             text otherwise
//
// A folder contributes its regular files, not its subfolders, sorted by name; hidden files are skipped,
// and a file reached twice through symlinks is read once (fortunes ships "art" and "art.u8" -> "art").
// In a folder, fortune and auto skip the strfile indexes "*.dat"; jsonl reads only "*.jsonl" and "*.json".
#pragma once

#include <map>
#include <string>
#include <vector>

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

namespace seqlab {

// The default corpus, no download needed: Debian's fortunes package (installed by ./train's set-up).
constexpr char kDefaultCorpus[] = "/usr/share/games/fortunes";

enum class DocFormat { text, fortune, jsonl, automatic };
absl::StatusOr<DocFormat> parse_doc_format(const std::string& name);  // "text", "fortune", "jsonl", "auto"
const char* doc_format_name(DocFormat f);

struct DocSource {
  std::string path;  // a file or a folder
  DocFormat format = DocFormat::automatic;
  std::string json_field = "text";
};

// The files a source reads, in reading order. An error when the path is missing or holds none.
absl::StatusOr<std::vector<std::string>> source_files(const DocSource& source);
// Every non-blank document of every file, in order. Errors name the file (and line, for JSONL).
absl::StatusOr<std::vector<std::string>> read_documents(const DocSource& source);

// The splitters behind the formats, for one file's text. Each document keeps its lines with their '\n'.
std::vector<std::string> split_paragraphs(absl::string_view text);
std::vector<std::string> split_fortunes(absl::string_view text);

// A small JSON reader for flat objects: enough for a JSONL document's field and for meta.json.
struct JsonValue {
  bool is_string = false;
  std::string text;  // a string's decoded value (escapes and \uXXXX resolved to UTF-8), else the raw text
};
// The members of one JSON object; nested objects and arrays come back as their raw text. Errors say what
// is wrong and at which character, without a file name (the caller adds it).
absl::StatusOr<std::map<std::string, JsonValue>> parse_json_object(absl::string_view text);
// `s` as a JSON string literal, quotes included.
std::string json_quote(absl::string_view s);

}  // namespace seqlab
