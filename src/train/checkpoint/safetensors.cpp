#include "train/checkpoint/safetensors.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <tuple>

#include "tensor/kernels.h"
#include "train/checkpoint/crc32c.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.cpp copies little-endian file data straight into memory"
#endif

namespace seqlab {

namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // as other readers: a larger header is corrupt
constexpr int kMaxJsonDepth = 64;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// ------------------------------------------------------------------------------------------------
// A JSON reader for the header: objects (members kept in file order, duplicate keys rejected),
// arrays, strings with every escape (\uXXXX and surrogate pairs to UTF-8), integers, true, false
// and null. Fractions and exponents are rejected: nothing in a header needs them.

struct Json {
  enum class Kind { null, boolean, integer, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  int64_t integer = 0;
  std::string string;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;
};

class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : s_(text) {}

  // "" on success, else what is wrong and where.
  std::string parse(Json* out) {
    if (value(out, 0)) {
      skip_space();
      if (i_ != s_.size()) fail("unexpected text after the JSON value");
    }
    return error_;
  }

 private:
  bool fail(const std::string& what) {
    if (error_.empty()) error_ = absl::StrCat(what, " at byte ", i_, " of the header");
    return false;
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool consume(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }

  bool value(Json* out, int depth) {
    if (depth > kMaxJsonDepth) return fail("JSON nested too deeply");
    skip_space();
    if (i_ >= s_.size()) return fail("unexpected end of the header");
    char c = s_[i_];
    if (c == '{') return object(out, depth);
    if (c == '[') return array(out, depth);
    if (c == '"') {
      out->kind = Json::Kind::string;
      return string(&out->string);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      out->kind = Json::Kind::integer;
      return integer(&out->integer);
    }
    for (auto [word, kind, b] : {std::tuple{"true", Json::Kind::boolean, true},
                                 std::tuple{"false", Json::Kind::boolean, false},
                                 std::tuple{"null", Json::Kind::null, false}}) {
      absl::string_view w(word);
      if (s_.substr(i_, w.size()) == w) {
        i_ += w.size();
        out->kind = kind;
        out->boolean = b;
        return true;
      }
    }
    return fail(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  bool object(Json* out, int depth) {
    out->kind = Json::Kind::object;
    ++i_;  // '{'
    if (consume('}')) return true;
    std::set<std::string> keys;
    do {
      skip_space();
      std::string key;
      if (i_ >= s_.size() || s_[i_] != '"') return fail("expected a quoted key");
      if (!string(&key)) return false;
      if (!keys.insert(key).second) return fail("duplicate key \"" + key + "\"");
      if (!consume(':')) return fail("expected ':' after key \"" + key + "\"");
      Json v;
      if (!value(&v, depth + 1)) return false;
      out->members.emplace_back(std::move(key), std::move(v));
    } while (consume(','));
    return consume('}') || fail("expected ',' or '}' in an object");
  }

  bool array(Json* out, int depth) {
    out->kind = Json::Kind::array;
    ++i_;  // '['
    if (consume(']')) return true;
    do {
      Json v;
      if (!value(&v, depth + 1)) return false;
      out->items.push_back(std::move(v));
    } while (consume(','));
    return consume(']') || fail("expected ',' or ']' in an array");
  }

  bool hex4(uint32_t* out) {
    if (s_.size() - i_ < 4) return fail("truncated \\u escape");
    *out = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0) return fail("bad hex digit in a \\u escape");
      *out = *out << 4 | static_cast<uint32_t>(d);
    }
    return true;
  }

  static void append_utf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | cp >> 6));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | cp >> 12));
      out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | cp >> 18));
      out->push_back(static_cast<char>(0x80 | (cp >> 12 & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  bool string(std::string* out) {
    ++i_;  // '"'
    while (true) {
      if (i_ >= s_.size()) return fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in a string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (i_ >= s_.size()) return fail("unterminated string");
      char e = s_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out->push_back(e); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          if (!hex4(&cp)) return false;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return fail("unpaired low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low = 0;
            if (s_.substr(i_, 2) != "\\u") return fail("unpaired high surrogate in a \\u escape");
            i_ += 2;
            if (!hex4(&low)) return false;
            if (low < 0xDC00 || low > 0xDFFF) return fail("unpaired high surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(cp, out);
          break;
        }
        default: return fail(absl::StrCat("unknown escape '\\", std::string(1, e), "'"));
      }
    }
  }

  bool integer(int64_t* out) {
    bool negative = s_[i_] == '-';
    if (negative) ++i_;
    if (i_ >= s_.size() || s_[i_] < '0' || s_[i_] > '9') return fail("expected a digit");
    if (s_[i_] == '0' && i_ + 1 < s_.size() && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9') {
      return fail("leading zero in a number");
    }
    uint64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      uint64_t d = static_cast<uint64_t>(s_[i_++] - '0');
      if (v > (uint64_t{INT64_MAX} - d) / 10) return fail("integer too large");
      v = v * 10 + d;
    }
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) {
      return fail("only integers are expected in the header");
    }
    *out = negative ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
    return true;
  }

  absl::string_view s_;
  size_t i_ = 0;
  std::string error_;
};

// ------------------------------------------------------------------------------------------------
// dtypes and JSON text

const char* safetensors_dtype(DType d) {
  switch (d) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
  }
  return "?";
}

bool dtype_of_name(const std::string& name, DType* out) {
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64}) {
    if (name == safetensors_dtype(d)) return *out = d, true;
  }
  return false;
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// An array of non-negative integers, else false.
bool to_sizes(const Json& j, std::vector<uint64_t>* out) {
  if (j.kind != Json::Kind::array) return false;
  out->clear();
  for (const Json& item : j.items) {
    if (item.kind != Json::Kind::integer || item.integer < 0) return false;
    out->push_back(static_cast<uint64_t>(item.integer));
  }
  return true;
}

struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

std::string offsets_str(const Entry& e) { return absl::StrCat("[", e.begin, ", ", e.end, "]"); }

// Checks one tensor's header entry against a data section of data_size bytes; "" or what is wrong.
std::string parse_entry(const std::string& name, const Json& j, uint64_t data_size, Entry* e) {
  e->name = name;
  std::string where = "tensor \"" + name + "\": ";
  if (j.kind != Json::Kind::object) return where + "entry is not a JSON object";
  const Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
  for (const auto& [key, v] : j.members) {
    if (key == "dtype") dtype = &v;
    else if (key == "shape") shape = &v;
    else if (key == "data_offsets") offsets = &v;
    else return where + "unexpected key \"" + key + "\"";
  }
  if (!dtype || !shape || !offsets) return where + "entry lacks one of \"dtype\", \"shape\", \"data_offsets\"";
  if (dtype->kind != Json::Kind::string) return where + "\"dtype\" is not a string";
  if (!dtype_of_name(dtype->string, &e->dtype)) {
    return where + "unsupported dtype \"" + dtype->string + "\" (supported: F32, F64, BF16, I32, I64)";
  }
  std::vector<uint64_t> dims, offs;
  if (!to_sizes(*shape, &dims)) return where + "\"shape\" is not an array of non-negative integers";
  if (!to_sizes(*offsets, &offs) || offs.size() != 2) {
    return where + "\"data_offsets\" is not an array of two non-negative integers";
  }
  e->begin = offs[0];
  e->end = offs[1];
  if (e->begin > e->end) return where + "data_offsets " + offsets_str(*e) + " end before they begin";
  if (e->end > data_size) {
    return absl::StrCat(where, "data_offsets ", offsets_str(*e), " lie outside the data section of ", data_size,
                        " bytes (truncated file?)");
  }
  // Products are capped at 2^62 so a corrupt shape cannot overflow them. `need` only has to be
  // compared; the product of the non-zero dimensions must fit so that strides can be computed.
  constexpr uint64_t kCap = uint64_t{1} << 62;
  uint64_t need = dtype_size(e->dtype), nonzero = 1;
  for (uint64_t d : dims) {
    if (d == 0) need = 0;
    if (d != 0 && need > kCap / d) need = UINT64_MAX;
    if (need != UINT64_MAX) need *= d;
    if (d != 0 && nonzero > kCap / d) return where + "shape [" + absl::StrJoin(dims, ", ") + "] is too large";
    if (d != 0) nonzero *= d;
    e->shape.push_back(static_cast<int64_t>(d));
  }
  if (need != e->end - e->begin) {
    return absl::StrCat(where, "shape ", shape_str(e->shape), " of ", dtype->string, " needs ",
                        need == UINT64_MAX ? "too many" : absl::StrCat(need), " bytes but data_offsets ",
                        offsets_str(*e), " hold ", e->end - e->begin);
  }
  return "";
}

}  // namespace

// ------------------------------------------------------------------------------------------------

absl::Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  auto invalid = [&](const std::string& what) { return absl::InvalidArgumentError(path + ": " + what); };
  std::vector<const std::pair<std::string, Tensor>*> order;
  for (const auto& entry : tensors) order.push_back(&entry);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string& name = order[k]->first;
    if (name.empty() || name == "__metadata__") return invalid("cannot write a tensor named \"" + name + "\"");
    if (k > 0 && order[k - 1]->first == name) return invalid("tensor name \"" + name + "\" appears twice");
    if (!order[k]->second.defined()) return invalid("tensor \"" + name + "\" is undefined");
  }

  std::vector<std::string> fields;
  if (!metadata.empty()) {
    std::vector<std::string> kv;
    for (const auto& [k, v] : metadata) kv.push_back(json_quote(k) + ":" + json_quote(v));
    fields.push_back("\"__metadata__\":{" + absl::StrJoin(kv, ",") + "}");
  }
  uint64_t offset = 0;
  for (const auto* entry : order) {
    const Tensor& t = entry->second;
    uint64_t end = offset + t.nbytes();
    fields.push_back(absl::StrCat(json_quote(entry->first), ":{\"dtype\":\"", safetensors_dtype(t.dtype()),
                                  "\",\"shape\":[", absl::StrJoin(t.shape(), ","), "],\"data_offsets\":[", offset,
                                  ",", end, "]}"));
    offset = end;
  }
  std::string header = "{" + absl::StrJoin(fields, ",") + "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  unsigned char len[8];
  for (int k = 0; k < 8; ++k) len[k] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * k));

  // Same folder as the target, so the rename cannot cross file systems.
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  auto fail = [&](const char* what) {
    std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat(path, ": ", what, " (", reason, ")"));
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return absl::InternalError(absl::StrCat(path, ": cannot create ", tmp, " (", std::strerror(errno), ")"));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(header.data(), 1, header.size(), f) == header.size();
  // One tensor at a time on the host, so a device checkpoint never needs a second full copy.
  for (size_t k = 0; ok && k < order.size(); ++k) {
    Tensor host = kernel::contiguous(kernel::to_device(order[k]->second, cpu_device()));
    ok = host.nbytes() == 0 || std::fwrite(host.raw_data(), 1, host.nbytes(), f) == host.nbytes();
  }
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  if (std::fclose(f) != 0 || !ok) return fail("write failed");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename failed");
  return absl::OkStatus();
}

namespace {

// A file's header, checked: its metadata and its tensors' entries, sorted by offset, which tile the
// data section that starts at byte data_start.
struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<Entry> entries;
  uint64_t data_start = 0;
};

// Opens `path` and reads and checks its header; every structural rule is checked before anything
// is allocated.
absl::StatusOr<File> open_and_read_header(const std::string& path, Header* out) {
  auto fail = [&](const std::string& what) { return absl::InvalidArgumentError(path + ": " + what); };
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));
  if (::fseeko(f.get(), 0, SEEK_END) != 0) return fail("cannot seek in the file");
  const off_t file_size = ::ftello(f.get());
  if (file_size < 0 || ::fseeko(f.get(), 0, SEEK_SET) != 0) return fail("cannot seek in the file");
  const uint64_t size = static_cast<uint64_t>(file_size);
  if (size < 8) return fail(absl::StrCat("truncated file: ", size, " bytes, fewer than the 8-byte header length"));

  unsigned char len[8];
  if (std::fread(len, 1, 8, f.get()) != 8) return fail("read failed");
  uint64_t header_len = 0;
  for (int k = 7; k >= 0; --k) header_len = header_len << 8 | len[k];
  if (header_len > size - 8) {
    return fail(absl::StrCat("header length ", header_len, " exceeds the ", size - 8,
                             " bytes that follow it (truncated file or corrupt header)"));
  }
  if (header_len > kMaxHeaderBytes) {
    return fail(absl::StrCat("corrupt header: length ", header_len, " exceeds 100 MiB"));
  }
  std::string text(header_len, '\0');
  if (header_len && std::fread(text.data(), 1, header_len, f.get()) != header_len) return fail("read failed");

  Json root;
  std::string error = JsonParser(text).parse(&root);
  if (!error.empty()) return fail("corrupt header: " + error);
  if (root.kind != Json::Kind::object) return fail("corrupt header: not a JSON object");

  out->data_start = 8 + header_len;
  const uint64_t data_size = size - out->data_start;
  std::vector<Entry>& entries = out->entries;
  for (const auto& [name, value] : root.members) {
    if (name == "__metadata__") {
      if (value.kind != Json::Kind::object) return fail("corrupt header: \"__metadata__\" is not a JSON object");
      for (const auto& [key, v] : value.members) {
        if (v.kind != Json::Kind::string) {
          return fail("corrupt header: \"__metadata__\" value of \"" + key + "\" is not a string");
        }
        out->metadata[key] = v.string;
      }
      continue;
    }
    entries.emplace_back();
    error = parse_entry(name, value, data_size, &entries.back());
    if (!error.empty()) return fail("corrupt header: " + error);
  }

  // The tensors must tile the data section exactly, as every writer lays them out.
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t covered = 0;
  for (size_t k = 0; k < entries.size(); ++k) {
    const Entry& e = entries[k];
    if (e.begin < covered) {
      return fail(absl::StrCat("corrupt header: tensors \"", entries[k - 1].name, "\" ", offsets_str(entries[k - 1]),
                               " and \"", e.name, "\" ", offsets_str(e), " overlap"));
    }
    if (e.begin > covered) {
      return fail(absl::StrCat("corrupt header: bytes [", covered, ", ", e.begin,
                               ") of the data section belong to no tensor"));
    }
    covered = e.end;
  }
  if (covered != data_size) {
    return fail(absl::StrCat("corrupt header: bytes [", covered, ", ", data_size,
                             ") of the data section belong to no tensor"));
  }
  return f;
}

}  // namespace

absl::StatusOr<SafetensorsContents> read_safetensors(const std::string& path) {
  Header h;
  absl::StatusOr<File> f = open_and_read_header(path, &h);
  if (!f.ok()) return f.status();
  SafetensorsContents out;
  out.metadata = std::move(h.metadata);
  for (const Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    const uint64_t n = e.end - e.begin;
    if (n && (::fseeko(f->get(), static_cast<off_t>(h.data_start + e.begin), SEEK_SET) != 0 ||
              std::fread(t.raw_data(), 1, n, f->get()) != n)) {
      return absl::InvalidArgumentError(path + ": read failed for tensor \"" + e.name + "\"");
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

absl::StatusOr<SafetensorsChecksums> read_safetensors_checksums(const std::string& path) {
  Header h;
  absl::StatusOr<File> f = open_and_read_header(path, &h);
  if (!f.ok()) return f.status();
  SafetensorsChecksums out;
  out.metadata = std::move(h.metadata);
  std::vector<unsigned char> buf(size_t{1} << 20);
  // The entries tile the data section in order: one sequential pass.
  if (::fseeko(f->get(), static_cast<off_t>(h.data_start), SEEK_SET) != 0) {
    return absl::InvalidArgumentError(path + ": cannot seek in the file");
  }
  for (const Entry& e : h.entries) {
    uint32_t crc = 0;
    for (uint64_t left = e.end - e.begin; left > 0;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
      if (std::fread(buf.data(), 1, n, f->get()) != n) {
        return absl::InvalidArgumentError(path + ": read failed for tensor \"" + e.name + "\"");
      }
      crc = crc32c(buf.data(), n, crc);
      left -= n;
    }
    out.crc32c.emplace(e.name, crc);
  }
  return out;
}

}  // namespace seqlab
