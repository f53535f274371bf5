// kiln/io/json.hpp - strict JSON parsing for the readers of safetensors headers and config.json.
//
// Needs nlohmann-json (Debian nlohmann-json3-dev; CMake: find_package(nlohmann_json) and link
// nlohmann_json::nlohmann_json). Only kiln/io/safetensors.hpp and kiln/io/hf_config.hpp include this,
// so a program that uses neither does not need nlohmann-json.
//
// On top of nlohmann's parser: duplicate keys in any object and nesting deeper than json_max_depth are
// errors (nlohmann would silently keep the last duplicate), and every failure is a kiln::FormatError
// naming the file.
#pragma once

#if !__has_include(<nlohmann/json.hpp>)
#error \
    "kiln/io/json.hpp (safetensors.hpp, hf_config.hpp) needs nlohmann-json: apt-get install nlohmann-json3-dev and link nlohmann_json::nlohmann_json"
#endif

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"
#include "kiln/io/common.hpp"

namespace kiln::io {

using json = nlohmann::json;

namespace detail {

inline constexpr int json_max_depth = 64;

/// Parses `text` as one JSON document. `what` ("safetensors", "config.json") and `file` name the source
/// in errors.
inline json parse_json(std::string_view text, std::string_view what, std::string_view file) {
  std::vector<std::set<std::string>> keys;  // keys seen in each open object
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
    if (depth > json_max_depth)
      fail<FormatError>("kiln: ", what, " file '", file, "': JSON nested deeper than ", json_max_depth, " levels");
    switch (ev) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() && !keys.back().insert(parsed.get<std::string>()).second)
          fail<FormatError>("kiln: ", what, " file '", file, "': duplicate JSON key ",
                            quote_name(parsed.get<std::string>()));
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    fail<FormatError>("kiln: ", what, " file '", file, "': invalid JSON: ", e.what());
  }
}

/// "object", "array", "string", "number", "boolean" or "null".
inline std::string_view json_type_name(const json& j) {
  switch (j.type()) {
    case json::value_t::object:
      return "object";
    case json::value_t::array:
      return "array";
    case json::value_t::string:
      return "string";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::null:
      return "null";
    case json::value_t::number_float:
      return "number (float)";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "number (integer)";
    default:
      return "unknown";
  }
}

/// A non-negative integer JSON value, else nullopt (floats, even integral ones, are rejected).
inline std::optional<uint64_t> json_u64(const json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return static_cast<uint64_t>(j.get<int64_t>());
  return std::nullopt;
}

}  // namespace detail
}  // namespace kiln::io
