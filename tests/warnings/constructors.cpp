// Part of warnings_library (CMakeLists.txt here; -O3): builds each compressor and policy from
// options it cannot see through, in a function of its own (as a user's code does), so that
// GCC compiles its constructor's checks and messages with nothing folded away.
#include "gravac/gravac.hpp"

namespace gravac_warnings {

template <class T>
T make(const gravac::layout& lay, const typename T::options& opt) {
  return T(lay, opt);
}

#define GRAVAC_WARNINGS_MAKE(T) template T make<T>(const gravac::layout&, const T::options&)
GRAVAC_WARNINGS_MAKE(gravac::qsgd);
GRAVAC_WARNINGS_MAKE(gravac::terngrad);
GRAVAC_WARNINGS_MAKE(gravac::topk);
GRAVAC_WARNINGS_MAKE(gravac::randomk);
GRAVAC_WARNINGS_MAKE(gravac::threshold);
GRAVAC_WARNINGS_MAKE(gravac::sign);
GRAVAC_WARNINGS_MAKE(gravac::cast16);
GRAVAC_WARNINGS_MAKE(gravac::adacomp);
GRAVAC_WARNINGS_MAKE(gravac::sparseloco);
GRAVAC_WARNINGS_MAKE(gravac::gravac_policy);
GRAVAC_WARNINGS_MAKE(gravac::accordion_policy);
GRAVAC_WARNINGS_MAKE(gravac::adacomp_policy);
GRAVAC_WARNINGS_MAKE(gravac::fixed_policy);
GRAVAC_WARNINGS_MAKE(gravac::moo_policy);
GRAVAC_WARNINGS_MAKE(gravac::local_steps_policy);
#undef GRAVAC_WARNINGS_MAKE

}  // namespace gravac_warnings
