#include "train/data/documents.h"

#include <absl/container/flat_hash_set.h>
#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <filesystem>

#include "train/data/data_io.h"

namespace seqlab {

namespace fs = std::filesystem;

namespace {

// Calls fn(line) for each line of `text` without its '\n' (a last line without one included).
template <class Fn>
void for_each_line(absl::string_view text, Fn&& fn) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == absl::string_view::npos) end = text.size();
    fn(text.substr(start, end - start));
    start = end + 1;
  }
}

bool is_blank(absl::string_view line) { return absl::StripAsciiWhitespace(line).empty(); }

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// Recursive descent over one JSON object. Only the top level is kept; nested values are validated
// and returned as raw text.
class JsonReader {
 public:
  explicit JsonReader(absl::string_view s) : s_(s) {}

  absl::StatusOr<std::map<std::string, JsonValue>> object() {
    std::map<std::string, JsonValue> members;
    if (!expect('{')) return error();
    space();
    if (!take('}')) {
      do {
        std::string key;
        JsonValue v;
        space();
        if (!string(&key) || !expect(':') || !value(&v, 0)) return error();
        members.emplace(std::move(key), std::move(v));  // the first of repeated keys wins
      } while (take(','));
      if (!expect('}')) return error();
    }
    space();
    if (i_ != s_.size()) {
      fail("unexpected text after the object");
      return error();
    }
    return members;
  }

 private:
  static constexpr int kMaxDepth = 128;  // bounds the recursion on hostile input

  absl::Status error() const { return absl::InvalidArgumentError(error_); }
  bool fail(const std::string& what) {
    if (error_.empty()) error_ = absl::StrCat("invalid JSON: ", what, " at character ", i_ + 1);
    return false;
  }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n')) ++i_;
  }
  bool take(char c) {
    space();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  bool expect(char c) { return take(c) || fail(absl::StrCat("expected '", std::string(1, c), "'")); }

  bool hex4(uint32_t* out) {
    if (i_ + 4 > s_.size()) return fail("truncated \\u escape");
    *out = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      int d = absl::ascii_isdigit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) return --i_, fail("bad hex digit in a \\u escape");
      *out = *out * 16 + static_cast<uint32_t>(d);
    }
    return true;
  }

  // A string literal at the cursor; decoded into *out when out is not null.
  bool string(std::string* out) {
    if (i_ >= s_.size() || s_[i_] != '"') return fail("expected a string");
    ++i_;
    std::string scratch;
    std::string& o = out ? *out : scratch;
    while (true) {
      size_t run = i_;  // copy plain bytes in one go
      while (i_ < s_.size() && s_[i_] != '"' && s_[i_] != '\\') ++i_;
      o.append(s_.data() + run, i_ - run);
      if (i_ >= s_.size()) return fail("unterminated string");
      if (s_[i_++] == '"') return true;
      if (i_ >= s_.size()) return fail("unterminated string");
      char e = s_[i_++];
      switch (e) {
        case '"': case '\\': case '/': o.push_back(e); break;
        case 'b': o.push_back('\b'); break;
        case 'f': o.push_back('\f'); break;
        case 'n': o.push_back('\n'); break;
        case 'r': o.push_back('\r'); break;
        case 't': o.push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          if (!hex4(&cp)) return false;
          if (cp >= 0xd800 && cp < 0xdc00 && s_.substr(i_, 2) == "\\u") {  // a surrogate pair
            size_t save = i_;
            i_ += 2;
            uint32_t low;
            if (!hex4(&low)) return false;
            if (low >= 0xdc00 && low < 0xe000) {
              cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
            } else {
              i_ = save;  // not a low surrogate: decode it on its own
            }
          }
          // A lone surrogate has no UTF-8 form; it becomes U+FFFD as in most JSON decoders.
          if (cp >= 0xd800 && cp < 0xe000) cp = 0xfffd;
          append_utf8(&o, cp);
          break;
        }
        default: return --i_, fail(absl::StrCat("bad escape '\\", std::string(1, e), "'"));
      }
    }
  }

  bool value(JsonValue* v, int depth) {
    space();
    if (i_ >= s_.size()) return fail("expected a value");
    if (s_[i_] == '"') {
      v->is_string = true;
      return string(&v->text);
    }
    size_t start = i_;
    if (!skip(depth)) return false;
    v->text = std::string(s_.substr(start, i_ - start));
    return true;
  }

  // Validates and steps over any non-string value (or a string, when nested).
  bool skip(int depth) {
    if (depth > kMaxDepth) return fail("nesting deeper than 128");
    space();
    if (i_ >= s_.size()) return fail("expected a value");
    char c = s_[i_];
    if (c == '"') return string(nullptr);
    if (c == '{' || c == '[') {
      char close = c == '{' ? '}' : ']';
      ++i_;
      if (take(close)) return true;
      do {
        space();
        if (c == '{' && (!string(nullptr) || !expect(':'))) return false;
        if (!skip(depth + 1)) return false;
      } while (take(','));
      return expect(close);
    }
    size_t start = i_;
    while (i_ < s_.size() && (absl::ascii_isalnum(s_[i_]) || s_[i_] == '-' || s_[i_] == '+' || s_[i_] == '.')) ++i_;
    absl::string_view word = s_.substr(start, i_ - start);
    double number;
    if (word == "true" || word == "false" || word == "null" ||
        (!word.empty() && (absl::ascii_isdigit(word[0]) || word[0] == '-') && absl::SimpleAtod(word, &number))) {
      return true;
    }
    i_ = start;
    return fail("expected a value");
  }

  absl::string_view s_;
  size_t i_ = 0;
  std::string error_;
};

DocFormat guess_format(const std::string& file, absl::string_view text) {
  if (absl::EndsWith(file, ".jsonl") || absl::EndsWith(file, ".json")) return DocFormat::jsonl;
  bool separator = false;
  for_each_line(text, [&](absl::string_view line) { separator = separator || line == "%" || line == "%\r"; });
  return separator ? DocFormat::fortune : DocFormat::text;
}

}  // namespace

absl::StatusOr<DocFormat> parse_doc_format(const std::string& name) {
  if (name == "text") return DocFormat::text;
  if (name == "fortune") return DocFormat::fortune;
  if (name == "jsonl") return DocFormat::jsonl;
  if (name == "auto") return DocFormat::automatic;
  return absl::InvalidArgumentError("unknown document format '" + name + "' (text, fortune, jsonl or auto)");
}

const char* doc_format_name(DocFormat f) {
  switch (f) {
    case DocFormat::text: return "text";
    case DocFormat::fortune: return "fortune";
    case DocFormat::jsonl: return "jsonl";
    case DocFormat::automatic: return "auto";
  }
  return "?";
}

std::vector<std::string> split_paragraphs(absl::string_view text) {
  std::vector<std::string> docs;
  std::string cur;
  for_each_line(text, [&](absl::string_view line) {
    if (is_blank(line)) {
      if (!cur.empty()) docs.push_back(std::move(cur));
      cur.clear();
    } else {
      absl::StrAppend(&cur, line, "\n");
    }
  });
  if (!cur.empty()) docs.push_back(std::move(cur));
  return docs;
}

std::vector<std::string> split_fortunes(absl::string_view text) {
  std::vector<std::string> docs;
  std::string cur;
  auto flush = [&] {
    if (!is_blank(cur)) docs.push_back(cur);
    cur.clear();
  };
  for_each_line(text, [&](absl::string_view line) {
    if (line == "%" || line == "%\r") {
      flush();
    } else {
      absl::StrAppend(&cur, line, "\n");
    }
  });
  flush();
  return docs;
}

absl::StatusOr<std::map<std::string, JsonValue>> parse_json_object(absl::string_view text) {
  return JsonReader(text).object();
}

std::string json_quote(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  return out + "\"";
}

absl::StatusOr<std::vector<std::string>> source_files(const DocSource& source) {
  std::error_code ec;
  fs::file_status st = fs::status(source.path, ec);
  if (ec || !fs::exists(st)) return absl::NotFoundError(source.path + ": no such file or folder");
  if (fs::is_regular_file(st)) return std::vector<std::string>{source.path};
  if (!fs::is_directory(st)) return absl::InvalidArgumentError(source.path + ": neither a file nor a folder");

  std::vector<fs::path> entries;
  for (const fs::directory_entry& e : fs::directory_iterator(source.path, ec)) entries.push_back(e.path());
  if (ec) return absl::InternalError(absl::StrCat(source.path, ": cannot list the folder (", ec.message(), ")"));
  std::sort(entries.begin(), entries.end());
  std::vector<std::string> files;
  absl::flat_hash_set<std::string> seen;
  for (const fs::path& p : entries) {
    std::string name = p.filename().string();
    if (absl::StartsWith(name, ".") || !fs::is_regular_file(p, ec)) continue;
    if (source.format != DocFormat::jsonl && source.format != DocFormat::text && absl::EndsWith(name, ".dat")) continue;
    if (source.format == DocFormat::jsonl && !absl::EndsWith(name, ".jsonl") && !absl::EndsWith(name, ".json")) continue;
    if (!seen.insert(fs::canonical(p, ec).string()).second) continue;
    files.push_back(p.string());
  }
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(source.path, ": the folder holds no ", doc_format_name(source.format), " files"));
  }
  return files;
}

absl::StatusOr<std::vector<std::string>> read_documents(const DocSource& source) {
  absl::StatusOr<std::vector<std::string>> files = source_files(source);
  if (!files.ok()) return files.status();
  std::vector<std::string> docs;
  for (const std::string& file : *files) {
    absl::StatusOr<std::string> text = read_file(file);
    if (!text.ok()) return text.status();
    DocFormat format = source.format == DocFormat::automatic ? guess_format(file, *text) : source.format;
    if (format != DocFormat::jsonl) {
      std::vector<std::string> d = format == DocFormat::text ? split_paragraphs(*text) : split_fortunes(*text);
      docs.insert(docs.end(), std::make_move_iterator(d.begin()), std::make_move_iterator(d.end()));
      continue;
    }
    int64_t line_no = 0;
    absl::Status status;
    for_each_line(*text, [&](absl::string_view line) {
      ++line_no;
      if (!status.ok() || is_blank(line)) return;
      auto where = [&] { return absl::StrCat(file, ":", line_no, ": "); };
      absl::StatusOr<std::map<std::string, JsonValue>> obj = parse_json_object(line);
      if (!obj.ok()) {
        status = absl::InvalidArgumentError(where() + std::string(obj.status().message()));
        return;
      }
      auto it = obj->find(source.json_field);
      if (it == obj->end() || !it->second.is_string) {
        status = absl::InvalidArgumentError(absl::StrCat(where(), it == obj->end() ? "no field " : "the field ",
                                                         json_quote(source.json_field),
                                                         it == obj->end() ? "" : " is not a string"));
        return;
      }
      if (!is_blank(it->second.text)) docs.push_back(std::move(it->second.text));
    });
    if (!status.ok()) return status;
  }
  return docs;
}

}  // namespace seqlab
