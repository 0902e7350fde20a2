#pragma once
//! \file
//! \brief The 16-bit formats of cast16 and cast16_cuda.

#include <cstdint>

namespace gravac {

//! The 16-bit format of cast16.
enum class cast16_format : std::uint8_t {
  fp16,  //!< IEEE half: 11-bit precision, largest finite 65504
  bf16,  //!< bfloat16: 8-bit precision, the range of float
};

}  // namespace gravac
