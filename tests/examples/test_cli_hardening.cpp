// kiln-generate and kiln-chat against misuse (issue 37): every numeric flag range-checked with a message
// naming flag, value and range (kiln-quantize's and kiln-bench-e2e's too); a full context ends generation
// normally; no -p starts from BOS; a KV cache beyond the machine's memory, a NaN weight (--check-tensors)
// and a mapped model file truncated under a running generation each end with a message naming the cause
// and exit status 1.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../../examples/cli_common.hpp"
#include "cli_test_util.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;

namespace {

fs::path hard_shared_model(const std::string& name) { return kiln::test::cli::shared_model(name); }
fs::path hard_temp_dir(const std::string& name) { return kiln::test::cli::temp_dir("kiln_cli_hardening_", name); }

std::string hard_slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

struct CliRun {
  int code = -1;  // exit status, or -1 when killed by a signal
  std::string out, err;
};

// Runs `exe args` (args already quoted), stdin from /dev/null (or `input`), stdout and stderr captured.
CliRun hard_run(const char* exe, const std::string& args, const fs::path& dir, const std::string& input = {}) {
  const fs::path in = dir / "stdin.txt", out = dir / "stdout.txt", err = dir / "stderr.txt";
  std::ofstream(in) << input;
  const std::string cmd = std::string("'") + exe + "' " + args + " < '" + in.string() + "' > '" + out.string() +
                          "' 2> '" + err.string() + "'";
  const int st = std::system(cmd.c_str());
  CliRun r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = hard_slurp(out);
  r.err = hard_slurp(err);
  return r;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("cli: every numeric flag is range-checked, naming flag, value and range") {
  const fs::path dir = hard_temp_dir("flags");
  const std::string m = "-m '" + hard_shared_model("stories260K.gguf").string() + "' ";
  struct Bad {
    std::string args, msg;
  };
  const std::vector<Bad> bad = {
      {"-n 1e20", "-n: '1e20' is out of range; expected an integer in [-1, 2147483647]"},
      {"-n 3e9", "-n: '3e9' is out of range"},
      {"-n inf", "-n: 'inf' is not finite"},
      {"-n nan", "-n: 'nan' is not a number"},
      {"-n -5", "-n: '-5' is out of range"},
      {"-n 2.5", "-n: '2.5' is not an integer"},
      {"-n 12x", "-n: '12x' is not a number"},
      {"-t 1e30", "-t: '1e30' is out of range; expected an integer in [0, 1024]"},
      {"-t -1", "-t: '-1' is out of range; expected an integer in [0, 1024]"},
      {"-c -1", "-c: '-1' is out of range; expected an integer in [0, 1073741824]"},
      {"-c 1e30", "-c: '1e30' is out of range"},
      {"-c 1e17", "-c: '1e17' is out of range"},
      {"--top-p 2", "--top-p: '2' is out of range; expected a number in (0, 1]"},
      {"--top-p 0", "--top-p: '0' is out of range; expected a number in (0, 1]"},
      {"--min-p 5", "--min-p: '5' is out of range; expected a number in [0, 1]"},
      {"--temp 1e9", "--temp: '1e9' is out of range; expected a number in [0, 100]"},
      {"--temp -1", "--temp: '-1' is out of range"},
      {"--top-k -3", "--top-k: '-3' is out of range"},
      {"--repeat-penalty 0", "--repeat-penalty: '0' is out of range; expected a number in (0, 100]"},
      {"--seed -2", "--seed: '-2' is out of range; expected an integer in [-1, 9223372036854775807]"},
      {"--seed 1e300", "--seed: '1e300' is out of range"},
  };
  for (const char* exe : {KILN_GENERATE_EXE, KILN_CHAT_EXE}) {
    for (const Bad& b : bad) {
      INFO(exe, " ", b.args);
      const CliRun r = hard_run(exe, m + b.args, dir);
      CHECK(r.code == 1);
      CHECK(has(r.err, b.msg));
    }
  }
  for (const char* t : {"-1", "1e30", "2000", "x"}) {
    INFO("kiln-quantize -t ", t);
    const CliRun r = hard_run(KILN_QUANTIZE_EXE, std::string("-t ") + t + " in.gguf out.gguf q8_0", dir);
    CHECK(r.code == 1);
    CHECK(has(r.err, std::string("-t: '") + t + "' is not a thread count; expected an integer in [0, 1024]"));
  }
  // Values at the ends of the ranges, and integers written as integral doubles, are accepted.
  const CliRun ok =
      hard_run(KILN_GENERATE_EXE, m + "-p Once -n 1e1 -t 1 -c 64 --top-p 1 --min-p 0 --temp 0 --seed 0", dir);
  CHECK(ok.code == 0);
}

TEST_CASE("cli: the parser reads integers exactly and never casts an out-of-range double") {
  using kiln_cli::parse_num;
  using kiln_cli::Range;
  CHECK(parse_num<long long>("--seed", "9223372036854775807", kiln_cli::kRangeSeed) == 9223372036854775807LL);
  CHECK_THROWS_WITH(parse_num<long long>("--seed", "9223372036854775808", kiln_cli::kRangeSeed),
                    doctest::Contains("out of range"));
  CHECK_THROWS_WITH(parse_num<long long>("--seed", "9.3e18", kiln_cli::kRangeSeed), doctest::Contains("out of range"));
  CHECK(parse_num<std::size_t>("-c", "1e3", kiln_cli::kRangeCtx) == 1000);
  CHECK_THROWS_WITH(parse_num<std::size_t>("-c", "", kiln_cli::kRangeCtx), doctest::Contains("is not a number"));
  CHECK_THROWS_WITH(parse_num<std::size_t>("-c", " 5", kiln_cli::kRangeCtx), doctest::Contains("is not a number"));
  CHECK(parse_num<int>("-n", "-1", kiln_cli::kRangeN) == -1);
  CHECK(parse_num<float>("--top-p", "0.5", kiln_cli::kRangeTopP) == 0.5f);
  CHECK_THROWS_WITH(parse_num<float>("--top-p", "1e-50", kiln_cli::kRangeTopP), doctest::Contains("out of range"));
  CHECK_THROWS_WITH(parse_num<float>("--temp", "-inf", kiln_cli::kRangeTemp), doctest::Contains("not finite"));
}

TEST_CASE("cli: a full context ends kiln-generate normally, with finish reason and timings") {
  const fs::path dir = hard_temp_dir("context_full");
  const std::string m = "-m '" + hard_shared_model("stories260K.gguf").string() + "' ";
  // The default -n 128 in stories260K's 128-position context: 5 prompt tokens leave room for 124.
  const CliRun r = hard_run(KILN_GENERATE_EXE, m + "-p 'Once upon a time' --temp 0", dir);
  CHECK(r.code == 0);
  CHECK(has(r.err, "kiln: generation   124 tokens"));
  CHECK(has(r.err, "finish reason: length (context full"));
  CHECK(has(r.err, "kiln: prompt"));
  CHECK(has(r.out, "Once upon a time"));
  // -n -1: until the context is full.
  const CliRun all = hard_run(KILN_GENERATE_EXE, m + "-p 'Once upon a time' --temp 0 -n -1 -c 32", dir);
  CHECK(all.code == 0);
  CHECK(has(all.err, "finish reason: length (context full"));
  // -n reached first.
  const CliRun n = hard_run(KILN_GENERATE_EXE, m + "-p 'Once upon a time' --temp 0 -n 4", dir);
  CHECK(n.code == 0);
  CHECK(has(n.err, "finish reason: length (-n tokens generated)"));
}

TEST_CASE("cli: kiln-generate without -p starts from the BOS token") {
  const fs::path dir = hard_temp_dir("no_prompt");
  const CliRun s =
      hard_run(KILN_GENERATE_EXE, "-m '" + hard_shared_model("stories260K.gguf").string() + "' -n 8 --temp 0", dir);
  CHECK(s.code == 0);
  CHECK(has(s.err, "kiln: prompt         1 tokens"));
  // SmolLM2's vocabulary does not prepend BOS to prompts (add_bos_token false) but has one.
  const CliRun m = hard_run(
      KILN_GENERATE_EXE, "-m '" + kiln::test::real_model("SmolLM2-135M-Instruct.Q4_1.gguf") + "' -n 4 --temp 0", dir);
  CHECK(m.code == 0);
  CHECK(has(m.err, "kiln: prompt         1 tokens"));
}

TEST_CASE("cli: the default context is min(4096, the model's), and a KV cache beyond the memory fails naming -c") {
  const fs::path dir = hard_temp_dir("ctx");
  const std::string smol = "-m '" + kiln::test::real_model("SmolLM2-135M-Instruct.Q4_1.gguf") + "' ";
  const CliRun d = hard_run(KILN_GENERATE_EXE, smol + "-p Hi -n 1 --temp 0", dir);  // trained with 8192
  CHECK(d.code == 0);
  CHECK(has(d.err, "ctx 4096,"));
  const CliRun s = hard_run(KILN_GENERATE_EXE, "-m '" + hard_shared_model("stories260K.gguf").string() + "' -p Hi -n 1",
                            dir);  // trained with 128
  CHECK(has(s.err, "ctx 128,"));
  // 2^30 positions of SmolLM2 (30 layers, 3 KV heads of 64, f16): 22 TiB.
  for (const char* exe : {KILN_GENERATE_EXE, KILN_CHAT_EXE}) {
    INFO(exe);
    const bool chat = std::string_view(exe) == KILN_CHAT_EXE;
    const CliRun r = hard_run(exe, smol + (chat ? "" : "-p Hi ") + "-c 1073741824", dir, "Hi\n");
    CHECK(r.code == 1);
    CHECK(has(r.err, "KV cache for -c 1073741824 needs 23040.00 GiB, "));
    CHECK(has(r.err, " GiB available"));
  }
}

TEST_CASE("cli: --check-tensors finds a NaN weight at load") {
  const fs::path dir = hard_temp_dir("check_tensors");
  const fs::path src = hard_shared_model("stories260K.gguf"), bad = dir / "nan.gguf";
  fs::copy_file(src, bad);
  std::size_t offset = 0;
  {
    const kiln::io::GGUFFile f(src, kiln::io::LoadMode::read);
    const auto* t = f.find_tensor("blk.2.ffn_up.weight");
    REQUIRE(t != nullptr);
    REQUIRE(t->type == kiln::io::GGMLType::F32);
    offset = std::size_t(t->data.data() - f.mapped_file()->data()) + 17 * sizeof(float);
  }
  {
    std::fstream io(bad, std::ios::in | std::ios::out | std::ios::binary);
    const float nan = std::nanf("");
    io.seekp(std::streamoff(offset));
    io.write(reinterpret_cast<const char*>(&nan), sizeof nan);
  }
  const std::string args = "-m '" + bad.string() + "' -n 4 --temp 0";
  const CliRun plain = hard_run(KILN_GENERATE_EXE, args + " -p Once", dir);
  CHECK(plain.code == 0);  // not scanned: the NaN goes unnoticed
  for (const char* exe : {KILN_GENERATE_EXE, KILN_CHAT_EXE}) {
    INFO(exe);
    const CliRun r = hard_run(exe, args + " --check-tensors", dir, "Hi\n");
    CHECK(r.code == 1);
    CHECK(has(r.err, "tensor 'blk.2.ffn_up.weight' (f32) has NaN at element 17 (--check-tensors)"));
  }
  const CliRun good =
      hard_run(KILN_GENERATE_EXE, "-m '" + src.string() + "' -p Once -n 4 --temp 0 --check-tensors", dir);
  CHECK(good.code == 0);
}

TEST_CASE("cli: a mapped model file truncated under a running kiln-generate ends it with a message, not SIGBUS") {
  const fs::path dir = hard_temp_dir("sigbus");
  const fs::path copy = dir / "smol.gguf";
  fs::copy_file(kiln::test::real_model("SmolLM2-135M-Instruct.Q4_1.gguf"), copy);
  const fs::path err = dir / "stderr.txt";
  // --no-pack: every weight stays in the mapping, so the next forward pass reads the truncated file.
  const std::string cmd = std::string("'") + KILN_GENERATE_EXE + "' -m '" + copy.string() +
                          "' -p 'Once upon a time' -n 2000 -c 4096 --temp 0 --no-pack 2> '" + err.string() + "'";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  // The first generated bytes on stdout: the model is loaded and generating (the prompt is echoed with them).
  char buf[1];
  const std::size_t got = std::fread(buf, 1, 1, p);
  CHECK(got == 1);
  fs::resize_file(copy, 0);
  while (std::fread(buf, 1, 1, p) == 1) {
  }
  const int st = ::pclose(p);
  INFO("stderr: ", hard_slurp(err));
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 1);
  CHECK(has(hard_slurp(err), "kiln: error: model file '" + copy.string() +
                                 "' was truncated or changed while mapped (SIGBUS reading it); a file that may "
                                 "change must be loaded with --load read"));
}

TEST_CASE("cli: the prompt progress line reads tokens done, tokens/s and time left") {
  CHECK(kiln_cli::PromptProgress::format(2048, 24391, 27.3) == "[prompt: 2048/24391 tokens, 75.0 tok/s, 298 s left]");
}

#ifdef KILN_BENCH_E2E_EXE  // built with the benchmarks (KILN_BUILD_BENCH)
TEST_CASE("cli: kiln-bench-e2e's numeric flags are range-checked, naming flag, value and range") {
  const fs::path dir = hard_temp_dir("bench_flags");
  const std::string m = "-m '" + hard_shared_model("stories260K.gguf").string() + "' ";
  struct Bad {
    std::string args, msg;
  };
  const std::vector<Bad> bad = {
      {"-t 0", "-t: '0' is out of range; expected an integer in [1, 1024]"},
      {"-t 1e30", "-t: '1e30' is out of range"},
      {"-n -5", "-n: '-5' is out of range; expected an integer in [0, 1073741824]"},
      {"-n 2.5", "-n: '2.5' is not an integer"},
      {"-r 0", "-r: '0' is out of range; expected an integer in [1, 1000000]"},
      {"-c 99999999999999999999", "-c: '99999999999999999999' is out of range; expected an integer in [0, 1073741824]"},
      {"-b 0", "-b: '0' is out of range; expected an integer in [1, 1048576]"},
      {"--seed 5000000000", "--seed: '5000000000' is out of range; expected an integer in [0, 4294967295]"},
      {"-p 128,0", "-p: '0' is out of range; expected an integer in [1, 1073741824]"},
      {"-p 128,x", "-p: 'x' is not a number"},
      {"-p 128,,4", "-p: '' is not a number"},
      {"--seqs 5000", "--seqs: '5000' is out of range; expected an integer in [1, 4096]"},
  };
  for (const Bad& b : bad) {
    INFO("kiln-bench-e2e ", b.args);
    const CliRun r = hard_run(KILN_BENCH_E2E_EXE, m + b.args, dir);
    CHECK(r.code == 1);
    CHECK(has(r.err, b.msg));
  }
  // The ends of the ranges run.
  const CliRun ok = hard_run(KILN_BENCH_E2E_EXE, m + "-t 1 -p 1,4 -n 0 -r 1 -c 8 -b 1 --seed 4294967295", dir);
  CHECK(ok.code == 0);
}
#endif

TEST_CASE("cli: kiln-generate --grammar / --grammar-file constrain the output; a bad grammar names line and column") {
  const fs::path dir = hard_temp_dir("grammar");
  const std::string m = "-m '" + hard_shared_model("stories260K.gguf").string() + "' -p 'Once upon a time' ";
  // The continuation is " yes" or " no" (stories260K knows neither answer: the grammar decides the shape), and
  // generation ends as soon as it is complete.
  const CliRun r = hard_run(KILN_GENERATE_EXE, m + "--temp 0 --grammar '" + R"(root ::= " yes" | " no")" + "'", dir);
  CHECK(r.code == 0);
  CHECK((r.out == "Once upon a time yes\n" || r.out == "Once upon a time no\n"));
  CHECK(has(r.err, "finish reason: stop (the constrained output is complete)"));
  // The same from a file, sampled: digits then a full stop.
  std::ofstream(dir / "g.gbnf") << "# three digits\nroot ::= \" \" [0-9]{3} \".\"\n";
  const CliRun f = hard_run(KILN_GENERATE_EXE, m + "--seed 3 --grammar-file '" + (dir / "g.gbnf").string() + "'", dir);
  CHECK(f.code == 0);
  const std::string tail = f.out.substr(std::string("Once upon a time").size());
  CHECK(tail.size() == 6);
  CHECK(tail[0] == ' ');
  for (std::size_t i = 1; i < 4 && i < tail.size(); ++i) CHECK((tail[i] >= '0' && tail[i] <= '9'));
  CHECK(f.out.substr(f.out.size() - 2) == ".\n");
  // Malformed: the parser's message with line and column, exit status 1.
  const CliRun b = hard_run(KILN_GENERATE_EXE, m + "--grammar '" + R"(root ::= "a" b)" + "'", dir);
  CHECK(b.code == 1);
  CHECK(has(b.err, "line 1, column 14: rule 'b' is used but never defined"));
  const CliRun n = hard_run(KILN_GENERATE_EXE, m + "--grammar-file '" + (dir / "missing.gbnf").string() + "'", dir);
  CHECK(n.code == 1);
  CHECK(has(n.err, "--grammar-file: cannot open"));
}
