/* fastgen_version.h compiles on its own. */
#include "fastgen_version.h"

int main(void) { return FG_VERSION_MAJOR >= 0 ? 0 : 1; }
