// Telemetry sinks: the CSV header and column order, values that read back exactly,
// valid JSON lines, non-finite numbers, stream failures, a user-defined sink, and no
// allocation per written report (global operator new is counted in this executable).
#include <atomic>
#include <catch2/catch.hpp>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <new>
#include <sstream>
#include <streambuf>
#include <string>
#include <vector>

#include "gravac/telemetry.hpp"
#include "gravac_test_util.hpp"

namespace {
std::atomic<long> allocations{0};
}  // namespace

// GCC cannot see that the replaced operator new below uses malloc.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

// Sanitizer runtimes own the allocator (TSan's defines every operator new itself), so the
// counting replacement exists only in ordinary builds; there the zero-allocation check
// below is real, and under a sanitizer the count stays 0 while the sanitizer checks memory.
#include "sanitized.hpp"

#if !GRAVAC_TEST_SANITIZED
// Counting replacement of the global allocation functions, for this test executable only.
// Every form is replaced, so that no library's own form ever mixes with these.
namespace {
void* counted_new(std::size_t n) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* counted_new_or_throw(std::size_t n) {
  if (void* p = counted_new(n)) return p;
  throw std::bad_alloc();
}
}  // namespace
void* operator new(std::size_t n) { return counted_new_or_throw(n); }
void* operator new[](std::size_t n) { return counted_new_or_throw(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_new(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#endif

using namespace gravac;

namespace {

std::vector<std::string> split(const std::string& line, char sep = ',') {
  std::vector<std::string> out(1);
  for (char c : line) {
    if (c == sep)
      out.emplace_back();
    else
      out.back() += c;
  }
  return out;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

double parse_double(const std::string& s) {
  double v = 0;
  const auto res = std::from_chars(s.data(), s.data() + s.size(), v);
  REQUIRE(res.ec == std::errc{});
  REQUIRE(res.ptr == s.data() + s.size());
  return v;
}

// A strict little JSON reader for one line: returns the top-level members as raw text
// (numbers, literals, strings with quotes, arrays with brackets); fails on bad syntax.
struct json_line {
  explicit json_line(const std::string& line) : s(line) {}
  const std::string& s;
  std::size_t i = 0;
  std::map<std::string, std::string> members;

  void ws() {
    while (i < s.size() && s[i] == ' ') ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) return ++i, true;
    return false;
  }
  std::string string() {
    REQUIRE(eat('"'));
    std::string out;
    while (i < s.size() && s[i] != '"') out += s[i++];
    REQUIRE(i < s.size());
    ++i;
    return out;
  }
  std::string value() {
    ws();
    const std::size_t start = i;
    REQUIRE(i < s.size());
    if (s[i] == '"') {
      string();
    } else if (s[i] == '[') {
      ++i;
      if (!eat(']')) {
        do value();
        while (eat(','));
        REQUIRE(eat(']'));
      }
    } else if (s.compare(i, 4, "true") == 0 || s.compare(i, 4, "null") == 0) {
      i += 4;
    } else if (s.compare(i, 5, "false") == 0) {
      i += 5;
    } else {
      const std::size_t b = i;
      while (i < s.size() && std::string_view("+-.eE0123456789").find(s[i]) != std::string_view::npos) ++i;
      REQUIRE(i > b);
      parse_double(s.substr(b, i - b));
    }
    return s.substr(start, i - start);
  }
  void parse() {
    REQUIRE(eat('{'));
    do {
      const auto k = string();
      REQUIRE(eat(':'));
      REQUIRE(members.count(k) == 0);
      members[k] = value();
    } while (eat(','));
    REQUIRE(eat('}'));
    REQUIRE(i == s.size());
  }
};

// Real reports from a two-rank trainer on thread ranks.
std::vector<step_report> real_reports(const layout& lay, int steps) {
  std::vector<step_report> out;
  run_ranks(2, [&](thread_communicator& comm) {
    using T = trainer<topk, allgather, fixed_policy>;
    T::options opt;
    opt.policy.kept_fraction = 0.1;
    T t(comm, lay, opt);
    for (int s = 0; s < steps; ++s) {
      auto g = test::make_data(lay.numel(), 100 * s + comm.rank() + 1);
      const auto& r = t.step(g);
      if (comm.rank() == 0) out.push_back(r);
    }
  });
  return out;
}

// A stream buffer over a fixed array: the stream itself never allocates.
struct fixed_buf : std::streambuf {
  explicit fixed_buf(std::vector<char>& v) { setp(v.data(), v.data() + v.size()); }
  std::size_t written() const { return static_cast<std::size_t>(pptr() - pbase()); }
};

}  // namespace

TEST_CASE("csv_sink: header, fixed column order and exact values", "[telemetry]") {
  layout lay = test::mixed_layout();
  lay.add("odd,\"name\"", {3}, layer_kind::bias_or_norm);
  const auto reports = real_reports(lay, 3);
  std::ostringstream os;
  csv_sink sink(os, lay);
  for (const auto& r : reports) sink.write(r);
  const auto ls = lines(os.str());
  REQUIRE(ls.size() == reports.size() + 1);

  // Header: the fixed columns, then kept_fraction:<layer>..., grad_norm:<layer>...
  std::string expect;
  for (std::size_t i = 0; i < csv_columns.size(); ++i) expect += (i ? "," : "") + std::string(csv_columns[i]);
  const auto base = test::mixed_layout();
  for (const auto& l : base.layers()) expect += ",kept_fraction:" + l.name;
  expect += ",\"kept_fraction:odd,\"\"name\"\"\"";
  for (const auto& l : base.layers()) expect += ",grad_norm:" + l.name;
  expect += ",\"grad_norm:odd,\"\"name\"\"\"";
  CHECK(ls[0] == expect);

  const std::size_t n_cols = csv_columns.size() + 2 * lay.size();
  for (std::size_t s = 0; s < reports.size(); ++s) {
    const auto& r = reports[s];
    const auto f = split(ls[s + 1]);
    REQUIRE(f.size() == n_cols);
    CHECK(f[0] == std::to_string(r.step));
    CHECK(f[1] == (r.skipped ? "1" : "0"));
    CHECK(f[2] == to_string(r.collective));
    CHECK(parse_double(f[3]) == r.gain);  // shortest round-trip form reads back exactly
    CHECK(f[4] == std::to_string(r.bytes_sent));
    CHECK(f[5] == std::to_string(r.dense_bytes));
    CHECK(parse_double(f[6]) == r.compress_s);
    CHECK(parse_double(f[7]) == r.communicate_s);
    CHECK(parse_double(f[8]) == r.decompress_s);
    CHECK(parse_double(f[10]) == r.iteration_s);
    double num = 0;
    for (std::size_t i = 0; i < lay.size(); ++i) {
      CHECK(parse_double(f[csv_columns.size() + i]) == r.kept_fraction[i]);
      CHECK(parse_double(f[csv_columns.size() + lay.size() + i]) == r.layer_grad_norm[i]);
      num += r.kept_fraction[i] * static_cast<double>(lay[i].numel);
    }
    CHECK(parse_double(f[12]) == Approx(num / static_cast<double>(lay.numel())));
    CHECK(r.bytes_sent > 0);
    CHECK(r.bytes_sent < r.dense_bytes);  // top-k at 10% really compressed
  }
}

TEST_CASE("csv_sink without a layout writes the fixed columns only; no header on request", "[telemetry]") {
  const auto reports = real_reports(test::mixed_layout(), 1);
  std::ostringstream os;
  csv_sink sink(os, false);
  sink.write(reports[0]);
  const auto ls = lines(os.str());
  REQUIRE(ls.size() == 1);
  CHECK(split(ls[0]).size() == csv_columns.size());
}

TEST_CASE("jsonl_sink: one valid JSON object per line with exact values", "[telemetry]") {
  const auto lay = test::mixed_layout();
  auto reports = real_reports(lay, 2);
  reports[1].gain_candidates = {0.01, 0.1};
  reports[1].gain_curve = {0.25, 0.75};
  std::ostringstream os;
  jsonl_sink sink(os);
  for (const auto& r : reports) sink.write(r);
  const auto ls = lines(os.str());
  REQUIRE(ls.size() == reports.size());
  for (std::size_t s = 0; s < reports.size(); ++s) {
    const auto& r = reports[s];
    json_line j{ls[s]};
    j.parse();
    CHECK(j.members.size() == 17);
    CHECK(j.members["fallback"] == "\"" + std::string(to_string(r.fallback)) + "\"");
    CHECK(j.members["step"] == std::to_string(r.step));
    CHECK(j.members["skipped"] == "false");
    CHECK(j.members["collective"] == "\"" + std::string(to_string(r.collective)) + "\"");
    CHECK(parse_double(j.members["gain"]) == r.gain);
    CHECK(j.members["bytes_sent"] == std::to_string(r.bytes_sent));
    CHECK(parse_double(j.members["communicate_s"]) == r.communicate_s);
    const auto kept = j.members["kept_fraction"];
    const auto items = split(kept.substr(1, kept.size() - 2));
    REQUIRE(items.size() == lay.size());
    for (std::size_t i = 0; i < lay.size(); ++i) CHECK(parse_double(items[i]) == r.kept_fraction[i]);
  }
  CHECK(ls[1].find("\"gain_candidates\":[0.01,0.1],\"gain_curve\":[0.25,0.75]") != std::string::npos);
}

TEST_CASE("non-finite numbers: nan/inf in CSV, null in JSON", "[telemetry]") {
  step_report r;
  r.gain = std::numeric_limits<double>::quiet_NaN();
  r.compress_s = std::numeric_limits<double>::infinity();
  r.communicate_s = -std::numeric_limits<double>::infinity();
  std::ostringstream csv, json;
  csv_sink(csv, false).write(r);
  jsonl_sink(json).write(r);
  const auto f = split(lines(csv.str())[0]);
  CHECK(f[3] == "nan");
  CHECK(f[6] == "inf");
  CHECK(f[7] == "-inf");
  const auto json_lines = lines(json.str());
  json_line j{json_lines[0]};
  j.parse();
  CHECK(j.members["gain"] == "null");
  CHECK(j.members["compress_s"] == "null");
  CHECK(j.members["communicate_s"] == "null");
}

TEST_CASE("sinks throw gravac::error on a failed stream or a foreign report", "[telemetry]") {
  std::ostringstream os;
  csv_sink sink(os, test::mixed_layout());
  step_report wrong;
  wrong.kept_fraction.assign(2, 0.5);
  wrong.layer_grad_norm.assign(2, 1.0);
  CHECK_THROWS_AS(sink.write(wrong), gravac::error);

  std::ostringstream bad;
  jsonl_sink js(bad);
  bad.setstate(std::ios::badbit);
  try {
    js.write(step_report{});
    FAIL("no exception");
  } catch (const gravac::error& e) {
    CHECK(e.code() == status::io_failure);
  }
}

TEST_CASE("a user-defined sink replaces the built-in ones", "[telemetry]") {
  struct bytes_sink final : telemetry_sink {
    std::vector<std::size_t> bytes;
    void write(const step_report& r) override { bytes.push_back(r.bytes_sent); }
  };
  const auto reports = real_reports(test::mixed_layout(), 3);
  bytes_sink mine;
  telemetry_sink& sink = mine;
  for (const auto& r : reports) sink.write(r);
  REQUIRE(mine.bytes.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(mine.bytes[i] == reports[i].bytes_sent);
}

TEST_CASE("writing a report allocates nothing beyond the stream", "[telemetry]") {
  const auto lay = test::mixed_layout();
  auto reports = real_reports(lay, 2);
  reports[1].gain_candidates = {0.01, 0.1};
  reports[1].gain_curve = {0.5, 0.9};
  std::vector<char> storage(1 << 16);
  fixed_buf buf(storage);
  std::ostream os(&buf);
  csv_sink csv(os, lay);
  jsonl_sink json(os);
  const std::size_t before_bytes = buf.written();
  const long before = allocations.load();
  for (int rep = 0; rep < 10; ++rep)
    for (const auto& r : reports) {
      csv.write(r);
      json.write(r);
    }
  const long after = allocations.load();
  CHECK(after - before == 0);
  CHECK(buf.written() > before_bytes);  // the sinks really wrote
  CHECK(os.good());
}
