// gravac._torch: the C++ half of gravac.torch. A DDP hook state and a trainer over a
// torch.distributed process group, both choosing compressor, collective and policy by name
// at run time (the Fashion-MNIST example's method table, fmnist/method.hpp, so the names and
// options are those of the example's command line and of the library's option structs).
#include <pybind11/stl.h>
#include <torch/extension.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <gravac/adapters/torch_ddp_hook.hpp>
#include <gravac/adapters/torch_process_group.hpp>
#include <gravac/detail/fnv1a.hpp>
#include <iterator>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "fmnist/method.hpp"

namespace py = pybind11;

namespace {

// --- names and options --------------------------------------------------------

template <class E, std::size_t N>
E by_name(const fmnist::named<E> (&table)[N], const std::string& name, const char* what) {
  std::string known;
  for (const auto& n : table) {
    if (n.name == name) return n.value;
    known += (known.empty() ? "" : ", ") + std::string(n.name);
  }
  throw gravac::error(gravac::status::invalid_argument,
                      "unknown " + std::string(what) + " '" + name + "' (known: " + known + ")");
}

using setter = std::function<void(fmnist::method_config&, py::handle)>;
struct option_entry {
  const char* name;
  setter set;
};

template <class T>
T as(py::handle v, const char* name) {
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!py::isinstance<py::bool_>(v)) throw py::cast_error();
    } else if constexpr (std::is_integral_v<T>) {
      if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) throw py::cast_error();
      if constexpr (std::is_unsigned_v<T>)
        if (v.cast<long long>() < 0) throw py::cast_error();
    }
    return v.cast<T>();
  } catch (const py::cast_error&) {
    throw gravac::error(gravac::status::invalid_argument, std::string("option ") + name + ": " +
                                                              std::string(py::str(py::repr(v))) + " is not " +
                                                              (std::is_same_v<T, bool>          ? "a bool"
                                                               : std::is_unsigned_v<T>          ? "a non-negative int"
                                                               : std::is_integral_v<T>          ? "an int"
                                                               : std::is_same_v<T, std::string> ? "a str"
                                                                                                : "a number"));
  }
}

template <class T>
std::string one_of(py::handle v, const char* name, std::initializer_list<const char*> allowed) {
  const auto s = as<std::string>(v, name);
  std::string list;
  for (const char* a : allowed) {
    if (s == a) return s;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  throw gravac::error(gravac::status::invalid_argument,
                      std::string("option ") + name + ": '" + s + "' is not one of " + list);
}

#define GRAVAC_OPTION(key, type, field)                                             \
  option_entry {                                                                    \
    key, [](fmnist::method_config& m, py::handle v) { m.field = as<type>(v, key); } \
  }

// The keyword options, named as the example's command-line flags without "--" and with '_'.
const std::vector<option_entry>& option_table() {
  static const std::vector<option_entry> table = {
      GRAVAC_OPTION("kept_fraction", double, fixed.kept_fraction),
      GRAVAC_OPTION("topk_whole_buffer", bool, topk.whole_buffer),
      GRAVAC_OPTION("qsgd_levels", std::uint32_t, qsgd.levels),
      GRAVAC_OPTION("powersgd_rank", std::uint32_t, powersgd.rank),
      GRAVAC_OPTION("powersgd_warm_start", bool, powersgd.warm_start),
      option_entry{"cast16_format",
                   [](fmnist::method_config& m, py::handle v) {
                     m.cast16.format = one_of<std::string>(v, "cast16_format", {"fp16", "bf16"}) == "bf16"
                                           ? gravac::cast16_format::bf16
                                           : gravac::cast16_format::fp16;
                   }},
      option_entry{"ar_rule",
                   [](fmnist::method_config& m, py::handle v) {
                     m.allreduce_compatible.rule = one_of<std::string>(v, "ar_rule", {"star", "var"}) == "var"
                                                       ? gravac::index_rank_rule::var
                                                       : gravac::index_rank_rule::star;
                     m.flexible.ar_topk.rule = m.allreduce_compatible.rule;
                   }},
      GRAVAC_OPTION("gravac_cf_min", double, gravac.cf_min),
      GRAVAC_OPTION("gravac_cf_max", double, gravac.cf_max),
      GRAVAC_OPTION("gravac_eps", double, gravac.epsilon),
      GRAVAC_OPTION("gravac_omega", double, gravac.omega),
      GRAVAC_OPTION("gravac_window", std::uint32_t, gravac.window),
      GRAVAC_OPTION("gravac_warmup", std::uint32_t, gravac.warmup_steps),
      GRAVAC_OPTION("gravac_period", std::uint32_t, gravac.period_steps),
      GRAVAC_OPTION("gravac_dense", bool, gravac.dense_candidate),
      GRAVAC_OPTION("gravac_dense_probe", std::uint32_t, gravac.dense_probe_steps),
      GRAVAC_OPTION("accordion_low", double, accordion.low_compression),
      GRAVAC_OPTION("accordion_high", double, accordion.high_compression),
      GRAVAC_OPTION("accordion_eta", double, accordion.eta),
      GRAVAC_OPTION("adacomp_conv_bin", std::uint32_t, adacomp_policy.conv_bin),
      GRAVAC_OPTION("adacomp_dense_bin", std::uint32_t, adacomp_policy.dense_bin),
      GRAVAC_OPTION("moo_warmup", std::uint32_t, moo.warmup_steps),
      GRAVAC_OPTION("moo_weight_time", double, moo.weight_time),
  };
  return table;
}
#undef GRAVAC_OPTION

fmnist::method_config make_method(const std::string& compressor, const std::string& collective,
                                  const std::string& policy, std::uint64_t seed, double bucket_mb,
                                  const py::dict& options) {
  fmnist::method_config m;
  m.compressor = by_name(fmnist::compressor_names, compressor, "compressor");
  m.collective = by_name(fmnist::collective_names, collective, "collective");
  m.policy = by_name(fmnist::policy_names, policy, "policy");
  m.seed = seed;
  gravac::require(bucket_mb >= 0, "bucket_mb must be non-negative, got " + std::to_string(bucket_mb));
  const double bytes = bucket_mb * 1048576.0;
  m.bucket_bytes = bytes < 1 ? gravac::bucket_per_layer : bytes >= 1e18 ? gravac::one_bucket : std::size_t(bytes);
  // A live run: the policies time what they measure on this machine, not a model.
  m.gravac.time.source = gravac::time_source::measured;
  m.flexible.source = m.moo.source = gravac::network_source::measured;
  for (const auto& [key, value] : options) {
    const auto k = key.cast<std::string>();
    const auto& table = option_table();
    const auto it = std::find_if(table.begin(), table.end(), [&](const option_entry& e) { return k == e.name; });
    if (it == table.end()) {
      std::string known;
      for (const auto& e : table) known += (known.empty() ? "" : ", ") + std::string(e.name);
      throw gravac::error(gravac::status::invalid_argument, "unknown option '" + k + "' (known: " + known + ")");
    }
    it->set(m, value);
  }
  return m;
}

// --- the step engine ------------------------------------------------------------

py::dict report_dict(const gravac::step_report& r) {
  py::dict d;
  d["step"] = r.step;
  d["bytes_sent"] = r.bytes_sent;
  d["dense_bytes"] = r.dense_bytes;
  d["wire_bytes_sent"] = r.wire_bytes_sent;
  d["wire_bytes_received"] = r.wire_bytes_received;
  d["gain"] = r.gain;
  d["collective"] = std::string(gravac::to_string(r.collective));
  d["fallback"] = std::string(gravac::to_string(r.fallback));
  d["compress_s"] = r.compress_s;
  d["communicate_s"] = r.communicate_s;
  d["decompress_s"] = r.decompress_s;
  d["exposed_communicate_s"] = r.exposed_communicate_s;
  d["buckets"] = r.buckets;
  d["skipped"] = r.skipped;
  d["kept_fraction"] = r.kept_fraction;
  return d;
}

std::vector<gravac::ddp_parameter> parameters_of(const std::vector<std::string>& names,
                                                 const std::vector<std::string>& module_types,
                                                 const std::vector<torch::Tensor>& tensors) {
  gravac::require(names.size() == tensors.size() && module_types.size() == tensors.size(),
                  "parameters: names, module types and tensors differ in number");
  std::vector<gravac::ddp_parameter> out;
  for (std::size_t i = 0; i < names.size(); ++i) out.push_back({names[i], module_types[i], tensors[i]});
  return out;
}

// A temporary file for one checkpoint, removed when this goes.
struct scratch_file {
  std::filesystem::path path;
  scratch_file() {
    static std::atomic<unsigned> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("gravac-state-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".ckpt");
  }
  ~scratch_file() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

// One runtime-chosen trainer<C, K, P> over a process group, with what ddp_hook_core needs.
class runtime_trainer {
 public:
  runtime_trainer(c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<gravac::ddp_parameter> params,
                  const fmnist::method_config& m, const std::string& signature)
      : comm_(std::move(group)), params_(std::move(params)), layout_(gravac::ddp_layout(params_)) {
    agree(signature);
    stepper_ = fmnist::make_stepper(m, gravac::communicator_ref<gravac::host_space>(comm_), layout_);
  }
  void begin_step(std::span<float> g) { stepper_->begin_step(g); }
  void ready(std::size_t layer) { stepper_->ready(layer); }
  const gravac::step_report& finish() { return stepper_->finish(); }
  const gravac::step_report& step(std::span<float> g) { return stepper_->step(g); }
  [[nodiscard]] const gravac::layout& get_layout() const noexcept { return layout_; }
  [[nodiscard]] const std::vector<gravac::ddp_parameter>& parameters() const noexcept { return params_; }
  [[nodiscard]] fmnist::stepper& stepper() noexcept { return *stepper_; }
  [[nodiscard]] int rank() const { return comm_.rank(); }

  py::bytes save() {
    scratch_file f;
    stepper_->save_checkpoint(f.path.string());
    std::ifstream in(f.path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return py::bytes(bytes);
  }
  void load(const std::string& bytes) {
    scratch_file f;
    {
      std::ofstream out(f.path, std::ios::binary);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      gravac::require(static_cast<bool>(out), "load_state_dict: cannot write a temporary file");
    }
    stepper_->restore_checkpoint(f.path.string());
  }

 private:
  // Every rank must have chosen the same method, options and parameters: a rank that did
  // not would send packets the others cannot read, or wait in another collective.
  void agree(const std::string& signature) {
    const auto mine = gravac::detail::fnv1a(signature.data(), signature.size(), layout_.hash());
    std::vector<std::byte> all;
    std::vector<std::size_t> sizes;
    comm_.allgatherv(std::as_bytes(std::span(&mine, 1)), all, sizes);
    std::string differ;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      std::uint64_t theirs = 0;
      gravac::require(sizes[r] == sizeof theirs, "ddp hook: a rank sent a malformed signature");
      std::memcpy(&theirs, all.data() + r * sizeof theirs, sizeof theirs);
      if (theirs != mine) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!differ.empty())
      throw gravac::error(gravac::status::layout_mismatch,
                          "gravac hook: rank " + std::to_string(comm_.rank()) +
                              " was built with another compressor, collective, policy, options or parameters "
                              "than rank(s) " +
                              differ + "; every rank must register the same hook on the same model");
  }

  gravac::process_group_communicator comm_;
  std::vector<gravac::ddp_parameter> params_;
  gravac::layout layout_;
  std::unique_ptr<fmnist::stepper> stepper_;
};

class hook_state {
 public:
  hook_state(c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<gravac::ddp_parameter> params,
             const fmnist::method_config& m, const std::string& signature, bool overlap)
      : trainer_(std::make_unique<runtime_trainer>(std::move(group), std::move(params), m, signature)),
        core_(std::make_unique<gravac::ddp_hook_core<runtime_trainer>>(*trainer_, trainer_->parameters(), overlap)) {}
  bool on_bucket(std::size_t index, const torch::Tensor& buffer, const std::vector<torch::Tensor>& params,
                 const std::vector<torch::Tensor>& grads, bool is_last) {
    return core_->on_bucket(index, buffer, params, grads, is_last);
  }
  runtime_trainer& trainer() { return *trainer_; }
  const gravac::step_report& last_report() const { return core_->last_report(); }
  void require_between_steps(const char* what) const {
    gravac::require(!core_->in_step(), std::string(what) + ": a step is in progress (call it between steps)");
  }

 private:
  std::unique_ptr<runtime_trainer> trainer_;
  std::unique_ptr<gravac::ddp_hook_core<runtime_trainer>> core_;
};

// Both classes are built from the same arguments (python/gravac/torch.py's _arguments).
template <class T>
void def_constructor(py::class_<T>& cls) {
  cls.def(py::init([](const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::vector<std::string>& names,
                      const std::vector<std::string>& types, const std::vector<torch::Tensor>& tensors,
                      const std::string& compressor, const std::string& collective, const std::string& policy,
                      std::uint64_t seed, double bucket_mb, const py::dict& options, const std::string& signature,
                      bool overlap) {
            const auto m = make_method(compressor, collective, policy, seed, bucket_mb, options);
            if constexpr (std::is_same_v<T, hook_state>)
              return std::make_unique<T>(group, parameters_of(names, types, tensors), m, signature, overlap);
            else
              return std::make_unique<T>(group, parameters_of(names, types, tensors), m, signature);
          }),
          py::arg("process_group"), py::arg("names"), py::arg("module_types"), py::arg("tensors"),
          py::arg("compressor"), py::arg("collective"), py::arg("policy"), py::arg("seed"), py::arg("bucket_mb"),
          py::arg("options"), py::arg("signature"), py::arg("overlap") = true);
}

}  // namespace

PYBIND11_MODULE(_torch, mod) {
  mod.doc() = "gravac's C++ trainer and DDP hook over torch.distributed process groups";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gravac::error& e) {
      if (e.code() == gravac::status::invalid_argument)
        PyErr_SetString(PyExc_ValueError, e.what());
      else
        PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  py::class_<runtime_trainer> trainer(mod, "Trainer");
  def_constructor(trainer);
  trainer
      .def("step",
           [](runtime_trainer& t, torch::Tensor& flat) {
             gravac::require(flat.device().is_cpu() && flat.scalar_type() == torch::kFloat32 && flat.is_contiguous() &&
                                 static_cast<std::size_t>(flat.numel()) == t.get_layout().numel(),
                             "Trainer.step: the gradient must be a contiguous CPU float32 tensor of the model's size");
             std::span<float> g(flat.data_ptr<float>(), static_cast<std::size_t>(flat.numel()));
             const gravac::step_report* r = nullptr;
             {
               py::gil_scoped_release release;  // the step blocks in collectives: let other threads run
               r = &t.step(g);
             }
             return report_dict(*r);
           })
      .def("numel", [](const runtime_trainer& t) { return t.get_layout().numel(); })
      .def("policy_state", [](runtime_trainer& t) { return t.stepper().policy_state(); })
      .def("save", &runtime_trainer::save)
      .def("load", &runtime_trainer::load);

  py::class_<hook_state> state(mod, "HookState");
  def_constructor(state);
  state
      .def(
          "on_bucket",
          [](hook_state& s, std::size_t index, const torch::Tensor& buffer, const std::vector<torch::Tensor>& params,
             const std::vector<torch::Tensor>& grads, bool is_last) {
            py::gil_scoped_release release;
            return s.on_bucket(index, buffer, params, grads, is_last);
          },
          py::arg("index"), py::arg("buffer"), py::arg("parameters"), py::arg("gradients"), py::arg("is_last"))
      .def("last_report", [](const hook_state& s) { return report_dict(s.last_report()); })
      .def("policy_state", [](hook_state& s) { return s.trainer().stepper().policy_state(); })
      .def("save",
           [](hook_state& s) {
             s.require_between_steps("state_dict");
             return s.trainer().save();
           })
      .def("load", [](hook_state& s, const std::string& bytes) {
        s.require_between_steps("load_state_dict");
        s.trainer().load(bytes);
      });

  mod.def("option_names", [] {
    std::vector<std::string> names;
    for (const auto& e : option_table()) names.emplace_back(e.name);
    return names;
  });
}
