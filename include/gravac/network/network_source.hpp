#pragma once
//! \file network_source.hpp
//! \brief Where the flexible collective and moo_policy get the network's alpha and beta.

#include <cstdint>

namespace gravac {

//! Where the network's (alpha, beta) come from.
enum class network_source : std::uint8_t {
  measured,  //!< fitted from measured times of the collectives run, max-reduced over ranks
  modeled,   //!< fitted from the engine's modeled clock (a simulated_communicator)
  profile,   //!< read from a network_profile at the step (or the engine's virtual time)
  fixed,     //!< the value given in the options
};

}  // namespace gravac
