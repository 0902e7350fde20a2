// gravac_c.h compiles as C++ (with warnings as errors) and links.
#include "gravac_c.h"

int main() {
  gravac_comm_callbacks cb{};
  cb.struct_size = sizeof cb;
  return gravac_abi_version() == GRAVAC_C_ABI_VERSION && cb.alltoallv == nullptr ? 0 : 1;
}
