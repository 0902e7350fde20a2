/* gravac_c.h compiles as C11 (-std=c11 -Wall -Wextra -Werror -pedantic) and links. */
#include "gravac_c.h"

int main(void) {
  gravac_method m = {0};
  m.struct_size = sizeof m;
  return gravac_abi_version() == GRAVAC_C_ABI_VERSION && m.struct_size == sizeof(gravac_method) ? 0 : 1;
}
