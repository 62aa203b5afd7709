/* fastgen.h compiles on its own. */
#include "fastgen.h"

int main(void) { return fg_status_string(FG_OK) ? 0 : 1; }
