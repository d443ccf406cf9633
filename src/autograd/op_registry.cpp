#include "autograd/op_registry.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <absl/strings/strip.h>

#include <algorithm>
#include <stdexcept>

namespace seqlab {

namespace {

std::vector<OpSpec>& registry() {
  static std::vector<OpSpec> ops;
  return ops;
}

bool parse_int(const std::string& text, int64_t* out) { return absl::SimpleAtoi(text, out); }

bool parse_number(const std::string& text, double* out) { return absl::SimpleAtod(text, out); }

bool parse_bool(const std::string& text, bool* out) {
  if (text == "true" || text == "1") return *out = true, true;
  if (text == "false" || text == "0") return *out = false, true;
  return false;
}

bool parse_int_list(const std::string& text, std::vector<int64_t>* out) {
  absl::string_view body = text;
  absl::ConsumePrefix(&body, "[");
  absl::ConsumeSuffix(&body, "]");
  out->clear();
  if (absl::StripAsciiWhitespace(body).empty()) return true;
  for (absl::string_view part : absl::StrSplit(body, ',')) {
    int64_t v;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &v)) return false;
    out->push_back(v);
  }
  return true;
}

const char* type_name(AttrType t) {
  switch (t) {
    case AttrType::integer: return "an integer";
    case AttrType::number: return "a number";
    case AttrType::boolean: return "true or false";
    case AttrType::string: return "a string";
    case AttrType::int_list: return "a list of integers like 0,2";
  }
  return "?";
}

// True when an integer attribute's text is integers all the same, only too large for 64 bits: "must be an
// integer" alone would not say what is wrong with 99999999999999999999.
bool integers_beyond_64_bits(AttrType t, const std::string& text) {
  auto integer_text = [](absl::string_view part) {
    part = absl::StripAsciiWhitespace(part);
    if (!absl::ConsumePrefix(&part, "-")) absl::ConsumePrefix(&part, "+");
    return !part.empty() && std::all_of(part.begin(), part.end(), absl::ascii_isdigit);
  };
  if (t == AttrType::integer) return integer_text(text);
  if (t != AttrType::int_list) return false;
  absl::string_view body = text;
  absl::ConsumePrefix(&body, "[");
  absl::ConsumeSuffix(&body, "]");
  for (absl::string_view part : absl::StrSplit(body, ',')) {
    if (!integer_text(part)) return false;
  }
  return true;
}

bool valid(AttrType t, const std::string& text) {
  int64_t i;
  double d;
  bool b;
  std::vector<int64_t> l;
  switch (t) {
    case AttrType::integer: return parse_int(text, &i);
    case AttrType::number: return parse_number(text, &d);
    case AttrType::boolean: return parse_bool(text, &b);
    case AttrType::string: return true;
    case AttrType::int_list: return parse_int_list(text, &l);
  }
  return false;
}

std::string json_escape(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The default as a JSON value of the attribute's type.
std::string json_value(const OpAttrSpec& a) {
  switch (a.type) {
    case AttrType::integer:
    case AttrType::number:
    case AttrType::boolean: return a.default_value == "1" && a.type == AttrType::boolean ? "true" : a.default_value;
    case AttrType::string: return json_escape(a.default_value);
    case AttrType::int_list: {
      std::vector<int64_t> l;
      parse_int_list(a.default_value, &l);
      return "[" + absl::StrJoin(l, ", ") + "]";
    }
  }
  return "null";
}

}  // namespace

OpAttrs OpAttrs::parse(const std::string& op, const std::vector<OpAttrSpec>& specs,
                       const std::map<std::string, std::string>& given) {
  OpAttrs attrs;
  attrs.op_ = op;
  for (const OpAttrSpec& s : specs) attrs.values_[s.name] = s.default_value;
  for (const auto& [name, value] : given) {
    auto it = std::find_if(specs.begin(), specs.end(), [&key = name](const OpAttrSpec& s) { return s.name == key; });
    if (it == specs.end()) {
      std::vector<std::string> names;
      for (const OpAttrSpec& s : specs) names.push_back(s.name);
      throw std::invalid_argument("op " + op + " has no attribute '" + name + "'" +
                                  (names.empty() ? " (it takes none)" : " (it takes: " + absl::StrJoin(names, ", ") + ")"));
    }
    if (!valid(it->type, value)) {
      throw std::invalid_argument("op " + op + ": attribute " + name + "='" + value + "' must be " +
                                  type_name(it->type) +
                                  (!integers_beyond_64_bits(it->type, value) ? ""
                                   : it->type == AttrType::integer   ? " from -2^63 to 2^63 - 1"
                                                                     : ", each from -2^63 to 2^63 - 1"));
    }
    attrs.values_[name] = value;
  }
  return attrs;
}

const std::string& OpAttrs::raw(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw std::logic_error("op " + op_ + " reads an undeclared attribute '" + name + "'");
  return it->second;
}

int64_t OpAttrs::get_int(const std::string& name) const {
  int64_t v;
  if (!parse_int(raw(name), &v)) throw std::invalid_argument("op " + op_ + ": attribute " + name + " is not an integer");
  return v;
}

double OpAttrs::get_number(const std::string& name) const {
  double v;
  if (!parse_number(raw(name), &v)) throw std::invalid_argument("op " + op_ + ": attribute " + name + " is not a number");
  return v;
}

bool OpAttrs::get_bool(const std::string& name) const {
  bool v;
  if (!parse_bool(raw(name), &v)) throw std::invalid_argument("op " + op_ + ": attribute " + name + " is not a boolean");
  return v;
}

const std::string& OpAttrs::get_string(const std::string& name) const { return raw(name); }

std::vector<int64_t> OpAttrs::get_int_list(const std::string& name) const {
  std::vector<int64_t> v;
  if (!parse_int_list(raw(name), &v)) {
    throw std::invalid_argument("op " + op_ + ": attribute " + name + " is not a list of integers");
  }
  return v;
}

void register_op(OpSpec spec) {
  auto& ops = registry();
  for (const OpSpec& o : ops) {
    if (o.name == spec.name) throw std::logic_error("op '" + spec.name + "' registered twice");
  }
  auto at = std::lower_bound(ops.begin(), ops.end(), spec.name,
                             [](const OpSpec& o, const std::string& n) { return o.name < n; });
  ops.insert(at, std::move(spec));
}

const std::vector<OpSpec>& registered_ops() { return registry(); }

const OpSpec* find_op(const std::string& name) {
  for (const OpSpec& o : registry()) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

std::string op_spec_json(const OpSpec& spec) {
  std::vector<std::string> inputs, outputs, attrs;
  for (const OpInputSpec& in : spec.inputs) inputs.push_back(json_escape(in.name));
  for (const std::string& out : spec.outputs) outputs.push_back(json_escape(out));
  for (const OpAttrSpec& a : spec.attrs) attrs.push_back(json_escape(a.name) + ": " + json_value(a));
  return "{\"name\": " + json_escape(spec.name) + ", \"inputs\": [" + absl::StrJoin(inputs, ", ") +
         "], \"outputs\": [" + absl::StrJoin(outputs, ", ") + "], \"attrs\": {" + absl::StrJoin(attrs, ", ") + "}}";
}

}  // namespace seqlab
