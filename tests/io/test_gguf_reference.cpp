// GGUF against independent references: gguf-py's reading of ../shared/models/stories260K.gguf and of a
// file gguf-py wrote with every metadata type (fixtures from tests/fixtures/make_io_fixtures.py), byte
// equality of kiln's writer with gguf-py's, and gguf-py's ggml type size table.
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "io_test_util.hpp"
#include "kiln/io/gguf_writer.hpp"

using namespace kiln;
using namespace kiln::test;
using nlohmann::json;

namespace {

json load_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  REQUIRE_MESSAGE(f.good(), "cannot read ", p.string());
  return json::parse(f);
}

/// Compares one metadata value with gguf-py's JSON rendering of it, recursively.
void check_value(const io::GGUFValue& v, const json& want) {
  switch (v.type()) {
    case io::GGUFValueType::STRING:
      CHECK(v.as<std::string>() == want.get<std::string>());
      break;
    case io::GGUFValueType::BOOL:
      CHECK(v.as<bool>() == want.get<bool>());
      break;
    case io::GGUFValueType::FLOAT32:
    case io::GGUFValueType::FLOAT64:
      CHECK(v.as<double>() == want.get<double>());  // both sides hold the stored value exactly
      break;
    case io::GGUFValueType::INT8:
    case io::GGUFValueType::INT16:
    case io::GGUFValueType::INT32:
    case io::GGUFValueType::INT64:
      CHECK(v.as<int64_t>() == want.get<int64_t>());
      break;
    case io::GGUFValueType::ARRAY: {
      REQUIRE(want.is_array());
      REQUIRE(v.size() == want.size());
      for (std::size_t i = 0; i < want.size(); ++i) check_value(v.at(i), want[i]);
      break;
    }
    default:
      CHECK(v.as<uint64_t>() == want.get<uint64_t>());
      break;
  }
}

/// Checks kiln's reading of `f` against gguf-py's dump (see make_io_fixtures.py for the fields).
void check_against_gguf_py(const io::GGUFFile& f, const json& ref) {
  CHECK(f.version() == ref["version"].get<uint32_t>());
  CHECK(f.alignment() == ref["alignment"].get<uint32_t>());
  CHECK(f.data_offset() == ref["data_offset"].get<uint64_t>());
  REQUIRE(f.metadata().size() == ref["metadata"].size());
  for (std::size_t i = 0; i < f.metadata().size(); ++i) {
    const auto& kv = f.metadata()[i];
    const auto& want = ref["metadata"][i];
    CAPTURE(want["key"].get<std::string>());
    CHECK(kv.key() == want["key"].get<std::string>());  // same order as in the file
    CHECK(io::gguf_type_name(kv.type()) == want["type"].get<std::string>());
    if (kv.type() == io::GGUFValueType::ARRAY)
      CHECK(io::gguf_type_name(kv.array_type()) == want["elem_type"].get<std::string>());
    check_value(kv, want["value"]);
  }
  REQUIRE(f.tensors().size() == ref["tensors"].size());
  for (std::size_t i = 0; i < f.tensors().size(); ++i) {
    const auto& t = f.tensors()[i];
    const auto& want = ref["tensors"][i];
    CAPTURE(want["name"].get<std::string>());
    CHECK(t.name == want["name"].get<std::string>());
    CHECK(static_cast<uint32_t>(t.type) == want["type"].get<uint32_t>());
    const auto ne = want["ne"].get<std::vector<uint64_t>>();
    REQUIRE(t.n_dims == ne.size());
    for (std::size_t d = 0; d < ne.size(); ++d) {
      CHECK(t.ne[d] == ne[d]);
      CHECK(t.extent(t.n_dims - 1 - d) == ne[d]);  // kiln order is ne reversed
    }
    CHECK(t.n_elements == want["n_elements"].get<uint64_t>());
    CHECK(t.n_bytes == want["n_bytes"].get<uint64_t>());
    // Zero-copy: the view is the file's bytes at gguf-py's absolute data offset.
    CHECK(t.data.data() == f.bytes().data() + want["data_offset"].get<uint64_t>());
    CHECK(crc32(t.data) == want["crc32"].get<uint32_t>());
    if (want.contains("fsum")) {
      double sum = 0, sum_abs = 0;
      if (t.type == io::GGMLType::F32) {
        for (float x : std::span<const float>(reinterpret_cast<const float*>(t.data.data()), t.n_elements)) {
          sum += x;
          sum_abs += std::fabs(x);
        }
      } else {
        for (f16 x : std::span<const f16>(reinterpret_cast<const f16*>(t.data.data()), t.n_elements)) {
          sum += float(x);
          sum_abs += std::fabs(float(x));
        }
      }
      // gguf-py's sums are exactly rounded (math.fsum); a naive double sum of n terms is within
      // n * 2^-53 * sum|x| of that, which 1e-9 * sum|x| covers for n < 10^7.
      CHECK(std::fabs(sum - want["fsum"].get<double>()) <= 1e-9 * want["fsum_abs"].get<double>());
      CHECK(std::fabs(sum_abs - want["fsum_abs"].get<double>()) <= 1e-9 * want["fsum_abs"].get<double>());
    }
  }
}

}  // namespace

TEST_CASE("GGUF reference: stories260K.gguf as kiln reads it") {
  const auto path = shared_model("stories260K.gguf");
  for (auto mode : {io::LoadMode::map, io::LoadMode::read}) {
    io::GGUFFile f(path, mode);
    CHECK(f.architecture() == "llama");
    CHECK(f.get<uint32_t>("llama.block_count") == 5);
    CHECK(f.get<uint32_t>("llama.embedding_length") == 64);
    CHECK(f.get<uint32_t>("llama.context_length") == 128);
    CHECK(f.get<uint32_t>("llama.attention.head_count") == 8);
    CHECK(f.get<uint32_t>("llama.attention.head_count_kv") == 4);
    CHECK(f.get<std::string>("tokenizer.ggml.model") == "llama");
    const auto vocab = f.get<std::vector<std::string>>("tokenizer.ggml.tokens");
    REQUIRE(vocab.size() == 512);
    CHECK(vocab[0] == "<unk>");
    CHECK(vocab[1] == "<s>");
    CHECK(vocab[2] == "</s>");
    CHECK(f.get<std::vector<float>>("tokenizer.ggml.scores").size() == 512);
    REQUIRE(f.tensors().size() == 48);
    // Tensor list: the 3 global tensors and 9 per layer, all F32; kiln shapes (outermost first).
    const std::vector<std::pair<std::string, std::vector<uint64_t>>> layer = {
        {"attn_q.weight", {64, 64}},      {"attn_k.weight", {32, 64}},  {"attn_v.weight", {32, 64}},
        {"attn_output.weight", {64, 64}}, {"attn_norm.weight", {64}},   {"ffn_gate.weight", {172, 64}},
        {"ffn_down.weight", {64, 172}},   {"ffn_up.weight", {172, 64}}, {"ffn_norm.weight", {64}}};
    std::vector<std::pair<std::string, std::vector<uint64_t>>> want = {
        {"token_embd.weight", {512, 64}}, {"output_norm.weight", {64}}, {"output.weight", {512, 64}}};
    for (int l = 0; l < 5; ++l)
      for (const auto& [n, s] : layer) want.push_back({"blk." + std::to_string(l) + "." + n, s});
    const std::byte* base = f.bytes().data();
    for (std::size_t i = 0; i < want.size(); ++i) {
      const auto& t = f.tensors()[i];
      CAPTURE(want[i].first);
      CHECK(t.name == want[i].first);
      CHECK(t.type == io::GGMLType::F32);
      REQUIRE(t.rank() == want[i].second.size());
      for (std::size_t r = 0; r < t.rank(); ++r) CHECK(t.extent(r) == want[i].second[r]);
      // Inside the file's bytes, and zero-copy: pointer identity with base + data section + offset.
      CHECK(t.data.data() == base + f.data_offset() + t.offset);
      CHECK(t.data.data() + t.n_bytes <= base + f.bytes().size());
    }
    if (mode == io::LoadMode::map) CHECK(f.mapped_file()->is_mapped());
    auto emb = f.view<float, 2>("token_embd.weight");  // (vocab, dim)
    CHECK((emb.extent(0) == 512 && emb.extent(1) == 64));
    CHECK(reinterpret_cast<const std::byte*>(emb.data()) ==
          base + f.data_offset() + f.tensor("token_embd.weight").offset);
  }
}

TEST_CASE("GGUF reference: stories260K.gguf matches gguf-py's reading") {
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  check_against_gguf_py(f, load_json(io_fixture("stories260K_gguf.json")));
}

TEST_CASE("GGUF reference: a file gguf-py wrote with every metadata type matches gguf-py's reading") {
  const io::GGUFFile f(io_fixture("gguf_py_all_types.gguf"));
  check_against_gguf_py(f, load_json(io_fixture("gguf_py_all_types.json")));
  // Typed access of the nested arrays (their JSON comes from the writer script, see the fixture).
  CHECK(f.get<std::vector<std::vector<int32_t>>>("t.arr_nested") == std::vector<std::vector<int32_t>>{{1, 2}, {3}});
  CHECK(f.get<std::vector<std::vector<std::string>>>("t.arr_nested_str") ==
        std::vector<std::vector<std::string>>{{"x"}, {"y", "z"}});
}

TEST_CASE("GGUF reference: kiln's writer produces gguf-py's bytes for the same content") {
  const auto ref_path = io_fixture("gguf_py_all_types.gguf");
  const Bytes ref = read_file_bytes(ref_path);
  const io::GGUFFile src(ref_path);  // tensor payloads are taken from the reference file
  // Same keys, types and order as make_io_fixtures.py's make_all_types_gguf().
  io::GGUFWriter w;
  w.add("general.architecture", "kilntest");
  w.add("t.u8", uint8_t(200));
  w.add("t.i8", int8_t(-100));
  w.add("t.u16", uint16_t(60000));
  w.add("t.i16", int16_t(-30000));
  w.add("t.u32", uint32_t(4000000000u));
  w.add("t.i32", int32_t(-2000000000));
  w.add("t.f32", 1.5f);
  w.add("t.bool", true);
  w.add("t.str", "h\xc3\xa9llo w\xc3\xb6rld");
  w.add("t.u64", uint64_t((1ull << 63) + 5));
  w.add("t.i64", int64_t(-(1ll << 62)));
  w.add("t.f64", 3.141592653589793);
  w.add("t.arr_u8", std::vector<uint8_t>{1, 2, 255});
  w.add("t.arr_i32", std::vector<int32_t>{-1, 0, 7});
  w.add("t.arr_f32", std::vector<float>{0.5f, -2.25f, 0.001f});
  w.add("t.arr_f64", std::vector<double>{1.0 / 3.0});
  w.add("t.arr_u64", std::vector<uint64_t>{~0ull, 0});
  w.add("t.arr_bool", std::vector<bool>{true, false, true});
  w.add("t.arr_str", std::vector<std::string>{"a", "", "ccc"});
  w.add("t.arr_nested", std::vector<std::vector<int32_t>>{{1, 2}, {3}});
  w.add("t.arr_nested_str", std::vector<std::vector<std::string>>{{"x"}, {"y", "z"}});
  for (const auto& t : src.tensors())
    w.add_tensor(std::string(t.name), t.type, std::span<const uint64_t>(t.ne.data(), t.n_dims), t.data);
  const Bytes mine = w.to_bytes();
  REQUIRE(mine.size() == ref.size());
  std::size_t first_diff = mine.size();
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (mine[i] != ref[i]) {
      first_diff = i;
      break;
    }
  CHECK_MESSAGE(first_diff == mine.size(), "first differing byte at offset ", first_diff);
}

TEST_CASE("GGUF reference: the ggml type table matches gguf-py's GGML_QUANT_SIZES") {
  const json ref = load_json(io_fixture("ggml_type_sizes.json"));
  std::size_t known = 0;
  for (uint32_t id = 0; id < 64; ++id) {
    CAPTURE(id);
    const auto info = io::ggml_type_info(id);
    const auto it = ref.find(std::to_string(id));
    if (it == ref.end()) {
      CHECK_FALSE(info.known());
      continue;
    }
    ++known;
    REQUIRE(info.known());
    CHECK(info.block_size == (*it)["block_size"].get<uint32_t>());
    if (id == 9) {
      // Q8_1: ggml's block_q8_1 is {f16 d, f16 s, int8 qs[32]} = 36 bytes; gguf-py 0.19 still lists the
      // old float layout (40). Q8_1 is an activation format that never appears in model files.
      CHECK(info.type_size == 36);
      CHECK((*it)["type_size"].get<uint32_t>() == 40);
    } else {
      CHECK(info.type_size == (*it)["type_size"].get<uint32_t>());
    }
    std::string name = (*it)["name"].get<std::string>();
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string mine(info.name);
    for (auto& c : mine) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    CHECK(mine == name);
  }
  CHECK(known == ref.size());
}
