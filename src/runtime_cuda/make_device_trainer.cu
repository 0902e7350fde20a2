// make_device_trainer and its composition verdicts, read off composition_verdict for every
// triple of the device compressors, the collectives and the policies at compile time; and
// the trainers of the device quantizers (qsgd_cuda, terngrad_cuda, sign_cuda, cast16_cuda and
// the block-scaled mxfp8_cuda, mxfp4_cuda, nvfp4_cuda),
// whose header may be included by one translation unit only (see dispatch_cuda.hpp).
#include <array>

#include "gravac/cuda/adacomp_cuda.hpp"
#include "gravac/cuda/block_scaled_cuda.hpp"
#include "gravac/cuda/cast16_cuda.hpp"
#include "gravac/cuda/qsgd_cuda.hpp"
#include "gravac/cuda/sign_cuda.hpp"
#include "gravac/cuda/terngrad_cuda.hpp"
#include "gravac/cuda/topk_cuda.hpp"
// (the compressors first: see dispatch_cuda.hpp)
#include "dispatch_cuda.hpp"

namespace gravac::runtime {
namespace detail {

// The device form of each host compressor of compressor_types (void: none).
template <class Host>
struct device_form {
  using type = void;
};
template <>
struct device_form<topk> {
  using type = topk_cuda;
};
template <>
struct device_form<threshold> {
  using type = threshold_cuda;
};
template <>
struct device_form<adacomp> {
  using type = adacomp_cuda;
};
template <>
struct device_form<qsgd> {
  using type = qsgd_cuda;
};
template <>
struct device_form<terngrad> {
  using type = terngrad_cuda;
};
template <>
struct device_form<sign> {
  using type = sign_cuda;
};
template <>
struct device_form<cast16> {
  using type = cast16_cuda;
};
template <>
struct device_form<mxfp8> {
  using type = mxfp8_cuda;
};
template <>
struct device_form<mxfp4> {
  using type = mxfp4_cuda;
};
template <>
struct device_form<nvfp4> {
  using type = nvfp4_cuda;
};

std::unique_ptr<any_trainer> make_device_quantizer(const method_config& m, device_comm comm, const layout& lay,
                                                   stream_ref s) {
  switch (m.compressor) {
    case compressor_id::qsgd: {
      qsgd_cuda::options o;
      o.stream = s;
      o.levels = m.qsgd.levels;
      o.bucket = m.qsgd.bucket;
      return make_device_for<qsgd_cuda>(m, comm, lay, o);
    }
    case compressor_id::terngrad: {
      terngrad_cuda::options o;
      o.stream = s;
      o.bucket = m.terngrad.bucket;
      return make_device_for<terngrad_cuda>(m, comm, lay, o);
    }
    case compressor_id::sign: {
      sign_cuda::options o;
      o.stream = s;
      return make_device_for<sign_cuda>(m, comm, lay, o);
    }
    case compressor_id::mxfp8: {
      mxfp8_cuda::options o;
      o.stream = s;
      o.element = m.mxfp8.element;
      o.rounding = m.mxfp8.rounding;
      o.error_feedback = m.mxfp8.error_feedback;
      return make_device_for<mxfp8_cuda>(m, comm, lay, o);
    }
    case compressor_id::mxfp4: {
      mxfp4_cuda::options o;
      o.stream = s;
      o.rounding = m.mxfp4.rounding;
      o.error_feedback = m.mxfp4.error_feedback;
      return make_device_for<mxfp4_cuda>(m, comm, lay, o);
    }
    case compressor_id::nvfp4: {
      nvfp4_cuda::options o;
      o.stream = s;
      o.rounding = m.nvfp4.rounding;
      o.error_feedback = m.nvfp4.error_feedback;
      return make_device_for<nvfp4_cuda>(m, comm, lay, o);
    }
    default: {
      cast16_cuda::options o;
      o.stream = s;
      o.format = m.cast16.format;
      return make_device_for<cast16_cuda>(m, comm, lay, o);
    }
  }
}

}  // namespace detail

namespace {

constexpr std::size_t n_compressors = std::size(compressor_names);
constexpr std::size_t n_collectives = std::size(collective_names);
constexpr std::size_t n_policies = std::size(policy_names);
constexpr int no_device_form = -1;

template <std::size_t I>
constexpr int device_verdict_at() {
  constexpr std::size_t c = I / (n_collectives * n_policies), k = I / n_policies % n_collectives, p = I % n_policies;
  using D = typename detail::device_form<std::tuple_element_t<c, detail::compressor_types>>::type;
  if constexpr (std::is_void_v<D>)
    return no_device_form;
  else
    return static_cast<int>(gravac::detail::composition_verdict<D, std::tuple_element_t<k, detail::collective_types>,
                                                                std::tuple_element_t<p, detail::policy_types>>());
}
template <std::size_t... I>
constexpr auto device_verdict_table(std::index_sequence<I...>) {
  return std::array<int, sizeof...(I)>{device_verdict_at<I>()...};
}
constexpr auto device_verdicts =
    device_verdict_table(std::make_index_sequence<n_compressors * n_collectives * n_policies>{});

int device_verdict_of(compressor_id c, collective_id k, policy_id p) {
  return device_verdicts[(static_cast<std::size_t>(c) * n_collectives + static_cast<std::size_t>(k)) * n_policies +
                         static_cast<std::size_t>(p)];
}

}  // namespace

bool has_device_form(compressor_id c) noexcept {
  return device_verdict_of(c, collective_id{}, policy_id{}) != no_device_form;
}

std::optional<rejection> device_verdict(const method_config& m) {
  const int v = device_verdict_of(m.compressor, m.collective, m.policy);
  if (v == no_device_form) return std::nullopt;
  return static_cast<rejection>(v);
}

void require_device_accepted(const method_config& m) {
  const auto v = device_verdict(m);
  if (v && *v == rejection::none) return;
  const std::string compressor(name_of(compressor_names, m.compressor));
  if (!v) {
    std::string forms;
    for (const auto& c : compressor_names)
      if (has_device_form(c.value)) forms += (forms.empty() ? "" : ", ") + std::string(c.name);
    throw error(status::invalid_argument, "compressor '" + compressor +
                                              "' has no device form: on CUDA memory gravac compresses with " + forms);
  }
  std::string offered;
  for (const auto& k : collective_names) {
    std::string policies;
    for (const auto& p : policy_names)
      if (device_verdict_of(m.compressor, k.value, p.value) == static_cast<int>(rejection::none))
        policies += (policies.empty() ? "" : ", ") + std::string(p.name);
    if (!policies.empty()) offered += (offered.empty() ? "" : "; ") + std::string(k.name) + " with " + policies;
  }
  throw error(status::invalid_argument, "gravac does not accept " + method_name(m) + " on device memory (" +
                                            compressor + "_cuda): " + to_string(*v) + ". With " + compressor +
                                            "_cuda it accepts " + (offered.empty() ? std::string("nothing") : offered));
}

std::unique_ptr<any_trainer> make_device_trainer(const method_config& m, device_comm comm, const layout& lay,
                                                 stream_ref stream) {
  require_device_accepted(m);
  switch (m.compressor) {
    case compressor_id::topk:
    case compressor_id::threshold:
      return detail::make_device_selection(m, comm, lay, stream);
    case compressor_id::adacomp:
      return detail::make_device_adacomp(m, comm, lay, stream);
    case compressor_id::qsgd:
    case compressor_id::terngrad:
    case compressor_id::sign:
    case compressor_id::cast16:
    case compressor_id::mxfp8:
    case compressor_id::mxfp4:
    case compressor_id::nvfp4:
      return detail::make_device_quantizer(m, comm, lay, stream);
    default:
      break;
  }
  throw error(status::invalid_argument, "gravac: no device form of this compressor");  // unreachable after the check
}

}  // namespace gravac::runtime
