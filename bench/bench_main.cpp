// bench/bench_main.cpp - kiln-bench's main: runs the registered benchmarks (every Google Benchmark flag
// works), then prints a summary table pairing each kernel's throughput with the memory read bandwidth
// measured in the same run at the same thread count (the roofline of a memory-bound kernel).
//
// Also holds that roofline: BM_memory_read, a STREAM-like read of a 512 MiB buffer (more than L3),
// split across the threads, with 1 or 4 independent streams per thread (more streams keep more
// hardware prefetchers and line-fill buffers busy). The summary uses the best of them per thread count.
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "kiln/core/amx.hpp"
#include "kiln/core/simd.hpp"
#include "read_bandwidth.hpp"

namespace {

using kiln::bench::read_streams;  // bench/read_bandwidth.hpp (shared with kiln-bench-e2e)

void BM_memory_read(benchmark::State& state) {
  const std::size_t n_threads = kiln::bench::threads(state);
  const int streams = static_cast<int>(state.range(1));
  const char* buf = reinterpret_cast<const char*>(kiln::bench::big_buffer());
  const std::size_t bytes = kiln::bench::kBigBufferBytes;
  const std::size_t part = bytes / n_threads / (128 * 4) * (128 * 4);  // per thread, a multiple of 128 * S
  auto read_part = [&](std::size_t t) {
    const char* p = buf + t * part;
    return streams == 4 ? read_streams<4>(p, part) : read_streams<1>(p, part);
  };
  kiln::ThreadPool* pool = kiln::bench::pool(state);
  for (auto _ : state) {
    std::vector<uint64_t> sums(n_threads);
    if (pool) pool->parallel_for(n_threads, [&](std::size_t t, std::size_t) { sums[t] = read_part(t); });
    else sums[0] = read_part(0);
    benchmark::DoNotOptimize(sums.data());
    benchmark::ClobberMemory();
  }
  kiln::bench::set_bytes(state, static_cast<double>(part * n_threads));
}
BENCHMARK(BM_memory_read)->Apply([](benchmark::internal::Benchmark* b) {
  kiln::bench::threaded(b, {"streams"}, {{1}, {4}});
  b->Unit(benchmark::kMillisecond);
});

// One line of the summary: a benchmark instance (name without the threads argument) at a thread count.
struct Result {
  std::string kernel;
  int64_t threads = 1;
  int64_t family = 0, instance = 0;  // registration order (the run order may be interleaved)
  std::vector<double> gbps, gflops;  // one per repetition (or the median aggregate alone)
  bool from_median_aggregate = false;
};

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Splits "threads:2/rows:4096" into the thread count and the rest.
std::pair<int64_t, std::string> split_threads(const std::string& args) {
  int64_t threads = 1;
  std::string rest;
  std::size_t pos = 0;
  while (pos <= args.size()) {
    const std::size_t end = std::min(args.find('/', pos), args.size());
    const std::string part = args.substr(pos, end - pos);
    if (part.rfind("threads:", 0) == 0) threads = std::strtoll(part.c_str() + 8, nullptr, 10);
    else if (!part.empty()) rest += (rest.empty() ? "" : "/") + part;
    pos = end + 1;
  }
  return {threads, rest};
}

// Forwards everything to the reporter the flags asked for and keeps each run's throughput counters.
class SummaryReporter : public benchmark::BenchmarkReporter {
 public:
  explicit SummaryReporter(std::unique_ptr<benchmark::BenchmarkReporter> inner) : inner_(std::move(inner)) {}

  bool ReportContext(const Context& context) override { return inner_->ReportContext(context); }
  void Finalize() override { inner_->Finalize(); }

  void ReportRuns(const std::vector<Run>& runs) override {
    inner_->ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const bool is_median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      if (run.run_type == Run::RT_Aggregate && !is_median) continue;
      auto [threads, rest] = split_threads(run.run_name.args);
      const std::string kernel = run.run_name.function_name + (rest.empty() ? "" : "/" + rest);
      const std::string key = kernel + "@" + std::to_string(threads);
      auto it = index_.find(key);
      if (it == index_.end()) {
        it = index_.emplace(key, results_.size()).first;
        results_.push_back(Result{kernel, threads, run.family_index, run.per_family_instance_index, {}, {}, false});
      }
      Result& r = results_[it->second];
      if (r.from_median_aggregate) continue;
      if (is_median) {  // the library's own median supersedes the repetitions seen so far
        r.gbps.clear();
        r.gflops.clear();
        r.from_median_aggregate = true;
      }
      auto counter = [&](const char* name, double scale) {
        auto c = run.counters.find(name);
        return c == run.counters.end() ? std::nan("") : c->second.value * scale;
      };
      r.gbps.push_back(counter("bytes_per_second", 1e-9));
      r.gflops.push_back(counter(kiln::bench::kFlopsCounter, 1e-9));
    }
  }

  void print_summary(std::FILE* out) {
    if (results_.empty()) return;
    std::stable_sort(results_.begin(), results_.end(), [](const Result& a, const Result& b) {
      return a.family != b.family ? a.family < b.family : a.instance < b.instance;
    });
    std::map<int64_t, double> best_read;  // threads -> GB/s
    for (const Result& r : results_)
      if (r.kernel.rfind(kiln::bench::kReadBandwidthName, 0) == 0) {
        const double g = median(r.gbps);
        if (!std::isnan(g)) best_read[r.threads] = std::max(best_read[r.threads], g);
      }
    std::size_t w = 6;
    for (const Result& r : results_) w = std::max(w, r.kernel.size());
    std::fprintf(out,
                 "\nSummary (medians over repetitions; GB/s = 1e9 B/s (the console's G/s for bytes is 2^30 B/s);\n"
                 "'of read' = GB/s / best %s GB/s at the same thread count)\n",
                 kiln::bench::kReadBandwidthName);
    std::fprintf(out, "%-*s %7s %9s %9s %8s\n", int(w), "kernel", "threads", "GB/s", "GFLOP/s", "of read");
    for (const Result& r : results_) {
      const double g = median(r.gbps), f = median(r.gflops);
      char gs[32] = "", fs[32] = "", frac[32] = "";
      if (!std::isnan(g)) std::snprintf(gs, sizeof gs, "%.2f", g);
      if (!std::isnan(f)) std::snprintf(fs, sizeof fs, "%.2f", f);
      auto br = best_read.find(r.threads);
      if (!std::isnan(g) && br != best_read.end() && br->second > 0)
        std::snprintf(frac, sizeof frac, "%.0f%%", 100.0 * g / br->second);
      std::fprintf(out, "%-*s %7lld %9s %9s %8s\n", int(w), r.kernel.c_str(), static_cast<long long>(r.threads), gs, fs,
                   frac);
    }
  }

  // The summary goes to stdout unless stdout carries JSON.
  bool machine_readable = false;

 private:
  std::unique_ptr<benchmark::BenchmarkReporter> inner_;
  std::vector<Result> results_;
  std::map<std::string, std::size_t> index_;
};

// The display reporter --benchmark_format asks for: console (coloured on a terminal) or json (csv, deprecated
// upstream, falls back to console).
std::unique_ptr<benchmark::BenchmarkReporter> make_display_reporter(int argc, char** argv, bool* machine_readable) {
  std::string format = "console";
  bool color = isatty(1);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--benchmark_format=", 0) == 0) format = a.substr(19);
    if (a == "--benchmark_color=false" || a == "--benchmark_color=no") color = false;
    if (a == "--benchmark_color=true" || a == "--benchmark_color=yes") color = true;
  }
  *machine_readable = format == "json";
  if (format == "json") return std::make_unique<benchmark::JSONReporter>();
  auto opts = benchmark::ConsoleReporter::OO_Tabular;
  if (color) opts = static_cast<benchmark::ConsoleReporter::OutputOptions>(opts | benchmark::ConsoleReporter::OO_Color);
  return std::make_unique<benchmark::ConsoleReporter>(opts);
}

}  // namespace

int main(int argc, char** argv) {
  bool machine_readable = false;
  auto inner = make_display_reporter(argc, argv, &machine_readable);
  // --kiln_target=NAME (before Google Benchmark sees the flags): run the kernels of that SIMD target
  // (kiln::simd::force_target, e.g. AVX2), as a CPU without the better ones would.
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i], key = "--kiln_target=";
    if (a.rfind(key, 0) != 0) continue;
    try {
      kiln::simd::force_target(a.substr(key.size()));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kiln-bench: %s\n", e.what());
      return 2;
    }
    std::fprintf(stderr, "kiln-bench: kernels of target %s\n", kiln::simd::current_target().c_str());
    for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
    --argc;
    --i;
  }
  // --amx / --no-amx: the integer GEMMs (and the f16/bf16 GEMMs that ask for it) on AMX tiles where usable (the
  // default), or on AVX-512 VNNI and f32 FMA (kiln::set_amx_enabled).
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a != "--amx" && a != "--no-amx") continue;
    kiln::set_amx_enabled({.enabled = a == "--amx"});
    std::fprintf(stderr, "kiln-bench: AMX %s\n", kiln::amx_active() ? "on" : "off");
    for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
    --argc;
    --i;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  SummaryReporter reporter(std::move(inner));
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_summary(machine_readable ? stderr : stdout);
  benchmark::Shutdown();
  return 0;
}
