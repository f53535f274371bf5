// kiln-perplexity end to end on the shared stories260K model: perplexity of a text, a base saved and a
// model compared against itself (KL divergence 0, the same top token everywhere), and misuse: every error
// names its cause and exits with status 1 (missing or short text, a context over the model's, a base file
// that is corrupt, of another vocabulary or of another context, flags out of range).
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli_test_util.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;

namespace {

struct PplRun {
  int code = -1;
  std::string out, err;
};

std::string ppl_slurp_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

PplRun ppl_run(const std::string& args, const fs::path& dir) {
  const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  const std::string cmd = std::string("'") + KILN_PERPLEXITY_EXE + "' " + args + " < /dev/null > '" + out.string() +
                          "' 2> '" + err.string() + "'";
  const int st = std::system(cmd.c_str());
  PplRun r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = ppl_slurp_file(out);
  r.err = ppl_slurp_file(err);
  return r;
}

bool ppl_has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A text long enough for a few chunks of 64 tokens of stories260K (its vocabulary: 512 tokens of children's
// stories).
std::string ppl_story() {
  std::string s;
  for (int i = 0; i < 12; ++i)
    s += "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
         "friends. One day, she saw a big red ball under a tree and ran to get it.\n";
  return s;
}

}  // namespace

TEST_CASE("kiln-perplexity: perplexity, a saved base and the model against itself") {
  const fs::path dir = kiln::test::cli::temp_dir("kiln_ppl_", "run");
  const std::string model = "-m '" + kiln::test::cli::shared_model("stories260K.gguf").string() + "'";
  std::ofstream(dir / "story.txt") << ppl_story();
  const std::string text = " -f '" + (dir / "story.txt").string() + "'";
  const PplRun help = ppl_run("--help", dir);
  CHECK(help.code == 0);
  CHECK(ppl_has(help.out, "--kl-divergence-base FILE"));
  const PplRun p = ppl_run(model + text + " -c 64 --chunks 3 -t 2", dir);
  INFO(p.err);
  REQUIRE(p.code == 0);
  CHECK(ppl_has(p.out, "[1]"));
  CHECK(ppl_has(p.out, "[3]"));
  CHECK(ppl_has(p.out, "Final estimate: PPL = "));
  CHECK(ppl_has(p.out, "3 chunks of 64 tokens, 93 tokens scored"));
  const std::string base = " --kl-divergence-base '" + (dir / "base.kld").string() + "'";
  const PplRun b = ppl_run(model + text + " -c 64 --chunks 3 -t 2" + base, dir);
  REQUIRE(b.code == 0);
  CHECK(ppl_has(b.err, "base saved"));
  // The same final line as without a base.
  CHECK(b.out.substr(b.out.find("Final")) == p.out.substr(p.out.find("Final")));
  const PplRun k = ppl_run(model + base + " --kl-divergence -t 2", dir);
  INFO(k.err);
  REQUIRE(k.code == 0);
  CHECK(ppl_has(k.out, "Mean    KLD:  0.000e+00 +/-  0.000e+00"));
  CHECK(ppl_has(k.out, "Same top p: 100.000 +/- 0.000 %"));
  CHECK(ppl_has(k.out, "Mean PPL(Q)/PPL(base)         :   1.000000"));
}

TEST_CASE("kiln-perplexity: misuse ends with a message naming the cause and status 1") {
  const fs::path dir = kiln::test::cli::temp_dir("kiln_ppl_", "misuse");
  const std::string model = "-m '" + kiln::test::cli::shared_model("stories260K.gguf").string() + "'";
  std::ofstream(dir / "story.txt") << ppl_story();
  std::ofstream(dir / "short.txt") << "Once upon a time, there was a cat.";
  const std::string text = " -f '" + (dir / "story.txt").string() + "'";
  const std::string base = " --kl-divergence-base '" + (dir / "base.kld").string() + "'";
  REQUIRE(ppl_run(model + text + " -c 64 --chunks 2" + base, dir).code == 0);
  const std::string tiny = "-m '" + std::string(KILN_SOURCE_DIR) + "/tests/fixtures/models/llama/model.gguf'";
  const std::string bad_base = (dir / "bad.kld").string();
  {
    std::string bytes = ppl_slurp_file(dir / "base.kld");
    bytes[bytes.size() / 2] ^= 1;
    std::ofstream(bad_base, std::ios::binary) << bytes;
  }
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {model + " -f '" + (dir / "none.txt").string() + "'", "none.txt' does not exist"},
      {model, "-f TEXT is needed"},
      {model + " -f '" + (dir / "short.txt").string() + "' -c 64", "tokens; -c 64 needs at least 128 (two chunks)"},
      {model + text + " -c 100000", "-c 100000 exceeds the model's trained context of 128"},
      {model + text + " -c 3", "-c: '3' is out of range; expected an integer in [4, 1073741824]"},
      {model + text + " --chunks -1", "--chunks: '-1' is out of range"},
      {model + text + " --kl-top-k 0", "--kl-top-k: '0' is out of range"},
      {model + text + " --precision half", "--precision must be 'fast', 'fast8' or 'exact', not 'half'"},
      {model + " --kl-divergence", "--kl-divergence needs --kl-divergence-base FILE"},
      {model + " --kl-divergence --kl-divergence-base '" + (dir / "none.kld").string() + "'", "cannot open"},
      {model + " --kl-divergence --kl-divergence-base '" + bad_base + "'", "checksum mismatch"},
      {model + " --kl-divergence --kl-divergence-base '" + (dir / "story.txt").string() + "'",
       "does not start with \"KILNKLD1\""},
      {model + " --kl-divergence -c 128" + base, "-c 128: the base '"},
      {tiny + " --kl-divergence" + base, "vocabulary of 512 tokens, the model has 256"},
      {model + text + " --bogus", "unknown option '--bogus'"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    const PplRun r = ppl_run(c.args, dir);
    CHECK(r.code == 1);
    CHECK_MESSAGE(ppl_has(r.err, c.message), r.err);
    CHECK(ppl_has(r.err, "kiln-perplexity: error: "));
  }
}
