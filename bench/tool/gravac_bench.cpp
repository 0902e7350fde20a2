// gravac-bench: times one CPU compressor on the user's own setting (layer sizes, kept
// fraction, options, data, threads), as training runs it (--dynamic, the default: a fresh
// gradient every step, the residual carried, timed in its steady state) or from one
// restored state (--restored: the best case). It prints the time per step, the ratios to
// a memcpy of the gradient buffer and to the error-feedback floor measured in the same run
// (bench_common.hpp, dynamic_steps.hpp: the method of the project's benchmarks), and the
// bits per element; --json prints one JSON object instead. Run with --help for the options:
// the compressors' options are those of the library's option table
// (gravac/runtime/option_table.hpp), as --name-with-dashes, and --help lists them from it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "../bench_common.hpp"
#include "../compressors.hpp"
#include "../dynamic_steps.hpp"
#include "../gradient_data.hpp"

namespace {

using namespace gravac_bench;

constexpr const char* usage_head = R"(usage: gravac-bench --compressor NAME [options]

Times one compressor as training runs it and prints the time per step, its ratio to a
memcpy of the gradient buffer and to the error-feedback floor (read g and e, write e and
a packet of the same size), both measured in the same run, and the bits per element.

what to time:
  --compressor NAME      )";

constexpr const char* usage_what = R"(
  --n N                  one layer of N floats (default 1048576)
  --layout A,B,...       layers of these sizes instead (e.g. your model's tensors)
  --fraction F           kept fraction of the selection compressors (default 0.01; the
                         table's --kept-fraction)
  --threads T            threads of top-k's fused pass (default 1; --topk-threads)
  --whole-buffer         top-k over the whole buffer instead of per layer (--topk-whole-buffer)
  --gain-candidates K    also report the gain curve of K kept fractions (a policy's request)
  --levels S --bucket B  QSGD's levels and bucket, TernGrad's bucket (--qsgd-levels,
                         --qsgd-bucket, --terngrad-bucket; QSGD's bucket when not given:
                         64 below 127 levels, else 512)
  --bf16                 cast16 to bfloat16 instead of fp16 (--cast16-format bf16)
  --bin-length L         AdaComp's L_T for every layer (default: by layer kind)
  --rank R               PowerSGD's rank, of every layer (default 4; --powersgd-rank)
data and method:
  --data D               gaussian (default), laplace, or FILE: recorded gradients, a
                         float32 .npy of shape (steps, params) or raw float32 (rows of the
                         layout's total size); a buffer longer than a row is tiled
  --dynamic              a fresh gradient every step, the residual carried, timed once its
                         norm changes by less than 1% per step (default)
  --restored             the same gradient and residual every call, restored untimed
                         (the best case: the previous step's predictions always fit)
  --steps S              timed samples (default 15; a sample is one step at 2^22 floats and
                         more, enough steps for about a millisecond of memcpy below)
  --max-warmup W         warm-up steps at most (default 1000)
  --seed X               seed of generated data (default 2024)
output:
  --json                 one JSON object instead of text
  --help                 this text
)";

// --help: the fixed text, the compressor names and every option of the library's table
// (name, type or choices, range, default here, doc), generated from the table.
std::string usage() {
  std::string names;  // wrapped at 90 columns, under the first
  std::size_t column = 25;
  for (const auto& n : compressor_names()) {
    if (!names.empty()) names += ",";
    if (!names.empty() && column + n.size() + 2 > 90) {
      names += "\n" + std::string(25, ' ');
      column = 25;
    } else if (!names.empty()) {
      names += " ";
      ++column;
    }
    names += n;
    column += n.size() + 1;
  }
  std::string u = usage_head + names + usage_what;
  // The fixed text ends with --help; the table's options follow.
  u += "\noptions of the library's option table (gravac/runtime/option_table.hpp), as\n"
       "--name-with-dashes VALUE, booleans as flags (--name, --no-name); the compressors\n"
       "read theirs (topk_*, threshold_*, randomk_*, qsgd_*, terngrad_*, cast16_*, powersgd_*)\n"
       "and kept_fraction; the others (adacomp_*: the AdaComp policy's, here --bin-length) are\n"
       "accepted and checked but change no compressor's step:\n";
  const gravac::runtime::method_config defaults = bench_method();
  char buf[96];
  for (const auto& o : gravac::runtime::option_table()) {
    std::string flag = "--" + std::string(o.name);
    std::replace(flag.begin(), flag.end(), '_', '-');
    std::string what;
    switch (o.type) {
      case gravac::runtime::option_type::boolean:
        flag += ", --no-" + flag.substr(2);
        what = "flag";
        break;
      case gravac::runtime::option_type::integer:
      case gravac::runtime::option_type::real:
        flag += o.type == gravac::runtime::option_type::integer ? " N" : " X";
        if (o.max >= gravac::runtime::detail::no_limit)
          std::snprintf(buf, sizeof buf, "%s >= %.10g",
                        o.type == gravac::runtime::option_type::integer ? "integer" : "real", o.min);
        else
          std::snprintf(buf, sizeof buf, "%s in [%.10g, %.10g]",
                        o.type == gravac::runtime::option_type::integer ? "integer" : "real", o.min, o.max);
        what = buf;
        break;
      case gravac::runtime::option_type::choice: {
        std::string c(o.choices);
        std::replace(c.begin(), c.end(), ',', '|');
        flag += " " + c;
        what = "one of " + std::string(o.choices);
        break;
      }
    }
    std::string def = o.get(defaults);  // a number as %.17g: shortest for reading
    if (o.type == gravac::runtime::option_type::integer || o.type == gravac::runtime::option_type::real) {
      std::snprintf(buf, sizeof buf, "%.10g", std::strtod(def.c_str(), nullptr));
      def = buf;
    }
    u += "  " + flag + "\n      " + std::string(o.doc) + " (" + what + "; default " + def + ")\n";
  }
  return u;
}

struct cli {
  std::string compressor;
  std::vector<std::size_t> layers{std::size_t{1} << 20};
  std::string data = "gaussian";
  bool restored = false, json = false;
  std::size_t samples = 15, max_warmup = 1000, gain_candidates = 0;
  std::uint64_t seed = 2024;
  compressor_settings settings;
};

std::size_t parse_size(const std::string& opt, const std::string& v) {
  std::size_t used = 0;
  unsigned long long x = 0;
  try {
    x = std::stoull(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || v[0] == '-')
    throw std::invalid_argument(opt + ": '" + v + "' is not a non-negative integer");
  return static_cast<std::size_t>(x);
}

double parse_double(const std::string& opt, const std::string& v) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || !std::isfinite(x))
    throw std::invalid_argument(opt + ": '" + v + "' is not a number");
  return x;
}

// The table's option spelt \p arg ("--topk-guess-margin" with \p prefix "--"), or nullptr.
const gravac::runtime::option_spec* table_option(const std::string& arg, std::string_view prefix) {
  if (arg.size() <= prefix.size() || arg.compare(0, prefix.size(), prefix) != 0) return nullptr;
  std::string name = arg.substr(prefix.size());
  if (name.find('_') != std::string::npos) return nullptr;  // the spelling is with dashes
  std::replace(name.begin(), name.end(), '-', '_');
  return gravac::runtime::find_option(name);
}

cli parse(int argc, char** argv) {
  cli c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(usage().c_str(), stdout);
      std::exit(0);
    } else if (a == "--compressor") {
      c.compressor = value();
    } else if (a == "--n") {
      c.layers = {parse_size(a, value())};
    } else if (a == "--layout") {
      c.layers.clear();
      std::stringstream ss(value());
      for (std::string part; std::getline(ss, part, ',');) c.layers.push_back(parse_size(a, part));
    } else if (a == "--fraction") {
      const std::string v = value();
      parse_double(a, v);
      c.settings.set("kept_fraction", v);
    } else if (a == "--threads") {
      c.settings.set("topk_threads", std::to_string(parse_size(a, value())));
    } else if (a == "--whole-buffer") {
      c.settings.set("topk_whole_buffer", "true");
    } else if (a == "--gain-candidates") {
      c.gain_candidates = parse_size(a, value());
    } else if (a == "--levels") {
      // 0: the default, 127 levels
      const std::size_t s = parse_size(a, value());
      if (s == 0)
        c.settings.method.qsgd.levels = bench_method().qsgd.levels;
      else
        c.settings.set("qsgd_levels", std::to_string(s));
    } else if (a == "--bucket") {
      // QSGD's and TernGrad's; 0: their defaults (QSGD's by its levels)
      const std::size_t b = parse_size(a, value());
      if (b == 0) {
        c.settings.qsgd_bucket_by_levels = true;
        c.settings.method.terngrad.bucket = bench_method().terngrad.bucket;
      } else {
        c.settings.set("qsgd_bucket", std::to_string(b));
        c.settings.set("terngrad_bucket", std::to_string(b));
      }
    } else if (a == "--bf16") {
      c.settings.set("cast16_format", "bf16");
    } else if (a == "--bin-length") {
      c.settings.bin_length = static_cast<std::uint32_t>(parse_size(a, value()));
    } else if (a == "--rank") {
      // PowerSGD's rank, also of every layer in each step; 0: the default, 4
      const std::size_t r = parse_size(a, value());
      if (r == 0)
        c.settings.method.powersgd.rank = bench_method().powersgd.rank;
      else
        c.settings.set("powersgd_rank", std::to_string(r));
      c.settings.rank = static_cast<std::uint32_t>(r);
    } else if (a == "--data") {
      c.data = value();
    } else if (a == "--dynamic") {
      c.restored = false;
    } else if (a == "--restored") {
      c.restored = true;
    } else if (a == "--steps") {
      c.samples = parse_size(a, value());
    } else if (a == "--max-warmup") {
      c.max_warmup = parse_size(a, value());
    } else if (a == "--seed") {
      c.seed = parse_size(a, value());
    } else if (a == "--json") {
      c.json = true;
    } else if (const auto* o = table_option(a, "--"); o != nullptr) {
      // An option of the library's table: a boolean is a flag, the rest take a value; a bad
      // value is set_option's error (exit status 2).
      c.settings.set(o->name, o->type == gravac::runtime::option_type::boolean ? std::string("true") : value());
    } else if (const auto* o = table_option(a, "--no-");
               o != nullptr && o->type == gravac::runtime::option_type::boolean) {
      c.settings.set(o->name, "false");
    } else {
      throw std::invalid_argument("unknown option '" + a + "' (see --help)");
    }
  }
  if (c.compressor.empty()) throw std::invalid_argument("--compressor is required (see --help)");
  if (c.layers.empty()) throw std::invalid_argument("--layout needs at least one layer size");
  for (auto l : c.layers)
    if (l == 0) throw std::invalid_argument("layer sizes must be positive");
  if (c.samples == 0) throw std::invalid_argument("--steps must be at least 1");
  if (c.gain_candidates > 0) {
    // Candidates spread log-evenly from 10% down to the fraction asked for (or 0.1%).
    const double lo = std::log(std::min(0.1, std::max(c.settings.fraction(), 1e-6)) * 0.1), hi = std::log(0.1);
    for (std::size_t j = 0; j < c.gain_candidates; ++j)
      c.settings.gain_candidates.push_back(
          std::exp(hi + (lo - hi) * static_cast<double>(j) /
                            static_cast<double>(std::max<std::size_t>(1, c.gain_candidates - 1))));
  }
  return c;
}

// One JSON string (the names here are plain, but a file name may hold anything).
std::string quoted(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\')
      o += '\\', o += ch;
    else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      o += buf;
    } else
      o += ch;
  }
  return o + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const cli c = parse(argc, argv);
    gravac::layout lay;
    for (std::size_t i = 0; i < c.layers.size(); ++i)
      lay.add("layer" + std::to_string(i), {c.layers[i]}, gravac::layer_kind::dense);
    const std::size_t n = lay.numel();
    const gradient_stream data = c.data == "gaussian"  ? gradient_stream::generated(n, data_kind::gaussian, c.seed)
                                 : c.data == "laplace" ? gradient_stream::generated(n, data_kind::laplace, c.seed)
                                                       : gradient_stream::recorded(load_gradients(c.data, n), n);
    auto comp = make_compressor(c.compressor, lay, c.settings);
    std::vector<float> e(n, 0.0f);
    const step_function step = [&](std::size_t, std::span<float> g) { return comp.compress(g, e); };
    dynamic_options opt;
    opt.samples = c.samples;
    opt.max_warmup = c.max_warmup;
    opt.min_warmup = std::min<std::size_t>(opt.min_warmup, c.max_warmup);
    opt.floor_second_pass = comp.floor_second_pass;
    if (comp.one_step_residual) {
      opt.gradient_window = 1;
      opt.fixed_warmup = true;
    }
    dynamic_result r;
    double ms = 0, to_memcpy = 0, to_floor = 0;
    std::size_t bytes = 0;
    if (!c.restored) {
      r = run_dynamic(data, e, step, opt);
      ms = 1e3 * r.seconds_per_step();
      to_memcpy = r.ratio_to_memcpy();
      to_floor = r.ratio_to_floor();
      bytes = r.packet_bytes;
    } else {
      // The residual error feedback leaves (a short dynamic warm-up), then the same step
      // from it every call: what the restored micro-benchmarks time.
      opt.samples = 1;
      r = run_dynamic(data, e, step, opt);
      std::vector<float> g(n), e0 = e;
      data.fill(r.first_timed_step + r.batch, g);
      const auto restore = [&] { std::memcpy(e.data(), e0.data(), n * sizeof(float)); };
      const auto call = [&] { bytes = comp.compress(g, e); };
      restore();
      call();
      const std::size_t calls = calls_for(n);
      const int pairs = static_cast<int>(std::max<std::size_t>(3, c.samples | 1));
      to_memcpy = paired_ratio(restore, call, memcpy_of(g), calls, pairs);
      to_floor = paired_ratio(restore, call, ef_floor_of(g, bytes, comp.floor_second_pass), calls, pairs);
      std::vector<double> times;
      for (int i = 0; i < pairs; ++i) {
        restore();
        const auto a = clock_type::now();
        call();
        times.push_back(seconds(a, clock_type::now()));
      }
      ms = 1e3 * dynamic_result::median(times);
    }
    const double bits = 8.0 * static_cast<double>(bytes) / static_cast<double>(n);
    std::string layout_text;
    for (auto l : c.layers) layout_text += (layout_text.empty() ? "" : ",") + std::to_string(l);
    if (c.json) {
      std::printf(
          "{\"compressor\": %s, \"n\": %zu, \"layers\": [%s], \"fraction\": %.9g, \"threads\": %u, \"data\": %s, "
          "\"mode\": \"%s\", \"steady\": %s, \"fixed_warmup\": %s, \"warmup_steps\": %zu, \"samples\": %zu, "
          "\"steps_per_sample\": %zu, "
          "\"ms_per_step\": %.6g, \"ratio_to_memcpy\": %.6g, \"ratio_to_ef_floor\": %.6g, \"ef_floor_to_memcpy\": "
          "%.6g, "
          "\"bits_per_element\": %.6g}\n",
          quoted(c.compressor).c_str(), n, layout_text.c_str(), c.settings.fraction(), c.settings.method.topk.threads,
          quoted(c.data).c_str(), c.restored ? "restored" : "dynamic", r.steady ? "true" : "false",
          opt.fixed_warmup ? "true" : "false", r.warmup_steps,
          c.restored ? static_cast<std::size_t>(std::max<std::size_t>(3, c.samples | 1)) : r.step_s.size(),
          c.restored ? std::size_t{1} : r.batch, ms, to_memcpy, to_floor, to_memcpy / to_floor, bits);
    } else {
      std::printf(
          "gravac-bench: %s, %zu floats in %zu layer(s), fraction %g, %u thread(s), data %s, %s\n",
          c.compressor.c_str(), n, c.layers.size(), c.settings.fraction(), c.settings.method.topk.threads,
          c.data.c_str(),
          c.restored ? "restored state (best case)" : "dynamic (steps with a fresh gradient, residual carried)");
      if (opt.fixed_warmup)
        std::printf("  %zu warm-up steps (its residual is one step's coding error; norm changing %.2f%% per step)\n",
                    r.warmup_steps, 100.0 * r.change_at_start);
      else if (r.steady)
        std::printf("  steady state after %zu warm-up steps (residual norm changing %.2f%% per step)\n", r.warmup_steps,
                    100.0 * r.change_at_start);
      else
        std::printf(
            "  steady state NOT reached in %zu warm-up steps (residual norm changing %.2f%% per step): "
            "raise --max-warmup\n",
            r.warmup_steps, 100.0 * r.change_at_start);
      std::printf("  time per step            %.3f ms (median)\n", ms);
      std::printf("  / memcpy                 %.2fx (same run)\n", to_memcpy);
      std::printf("  / error-feedback floor   %.2fx (the floor is %.2fx memcpy)\n", to_floor, to_memcpy / to_floor);
      std::printf("  bits per element         %.3f\n", bits);
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "gravac-bench: %s\n", ex.what());
    return 2;
  }
  return 0;
}
