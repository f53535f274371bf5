// kiln/serve/metrics.hpp - what a Scheduler counts: requests, tokens, queue and slots, and histograms of
// time to first token and inter-token latency; to_prometheus() writes them in Prometheus' text format.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/error.hpp"

namespace kiln::serve {

/// A cumulative histogram with fixed upper bounds (seconds), Prometheus style.
struct Histogram {
  std::vector<double> bounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  std::vector<uint64_t> counts = std::vector<uint64_t>(bounds.size() + 1, 0);  // the last: +Inf only
  double sum = 0;
  uint64_t count = 0;
  void add(double v) {
    std::size_t i = 0;
    while (i < bounds.size() && v > bounds[i]) ++i;
    ++counts[i];
    sum += v;
    ++count;
  }
};

struct Metrics {
  explicit Metrics(std::size_t n_slots = 0) : slots(n_slots) {}
  std::size_t slots = 0;
  uint64_t requests = 0;                  // submitted
  std::array<uint64_t, 5> finished = {};  // by kiln::serve::Finish
  uint64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  uint64_t prompt_tokens_evaluated = 0;  // prompt tokens run through the model (not taken from a cache)
  std::size_t queue = 0, busy = 0;       // waiting requests, slots running one
  Histogram ttft, itl;                   // seconds: submit -> first token, token -> next token
};

/// The metrics in Prometheus' text exposition format (names prefixed kiln_).
inline std::string to_prometheus(const Metrics& m) {
  std::string o;
  auto num = [](double v) { return detail::concat(v); };
  auto metric = [&](const char* name, const char* type, const char* help, const std::string& value) {
    o += detail::concat("# HELP kiln_", name, " ", help, "\n# TYPE kiln_", name, " ", type, "\nkiln_", name, " ", value,
                        "\n");
  };
  metric("requests_total", "counter", "Requests submitted.", num(double(m.requests)));
  o += "# HELP kiln_requests_finished_total Requests finished, by reason.\n# TYPE kiln_requests_finished_total "
       "counter\n";
  const char* reasons[] = {"running", "stop", "length", "cancelled", "error"};
  for (std::size_t i = 1; i < m.finished.size(); ++i)
    o += detail::concat("kiln_requests_finished_total{reason=\"", reasons[i], "\"} ", m.finished[i], "\n");
  metric("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", num(double(m.prompt_tokens)));
  metric("prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's cache.",
         num(double(m.cached_tokens)));
  metric("prompt_tokens_evaluated_total", "counter",
         "Prompt tokens run through the model (the rest came from a cache).", num(double(m.prompt_tokens_evaluated)));
  metric("generated_tokens_total", "counter", "Tokens generated.", num(double(m.generated_tokens)));
  metric("queue_depth", "gauge", "Requests waiting for a slot.", num(double(m.queue)));
  metric("slots_busy", "gauge", "Slots running a request.", num(double(m.busy)));
  metric("slots_total", "gauge", "Slots.", num(double(m.slots)));
  auto hist = [&](const char* name, const char* help, const Histogram& h) {
    o += detail::concat("# HELP kiln_", name, " ", help, "\n# TYPE kiln_", name, " histogram\n");
    uint64_t cum = 0;
    for (std::size_t i = 0; i < h.bounds.size(); ++i) {
      cum += h.counts[i];
      o += detail::concat("kiln_", name, "_bucket{le=\"", h.bounds[i], "\"} ", cum, "\n");
    }
    o += detail::concat("kiln_", name, "_bucket{le=\"+Inf\"} ", h.count, "\nkiln_", name, "_sum ", h.sum, "\nkiln_",
                        name, "_count ", h.count, "\n");
  };
  hist("time_to_first_token_seconds", "From submission to the first generated token.", m.ttft);
  hist("inter_token_seconds", "Between consecutive generated tokens of a request.", m.itl);
  return o;
}

}  // namespace kiln::serve
