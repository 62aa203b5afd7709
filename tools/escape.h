/* Text into JSON and XML: the one place every writer of tools/ escapes. */
#ifndef FG_CLI_ESCAPE_H
#define FG_CLI_ESCAPE_H

#include <stddef.h>
#include <stdio.h>

/* A JSON string, quoted: quotes, backslashes and control characters
 * escaped, every byte that is not part of well-formed UTF-8 written as
 * U+FFFD. */
void cli_json_string(FILE *f, const char *s);
/* XML character data or an attribute value (unquoted): & < > " ' as
 * entities, tab, newline and carriage return as they are, the control
 * characters XML 1.0 cannot hold and every byte that is not part of
 * well-formed UTF-8 as U+FFFD. */
void cli_xml_text(FILE *f, const char *s);
/* Cuts s back to a character boundary: a UTF-8 sequence that a bounded copy
 * (snprintf) cut short at its end goes. Returns s. */
char *cli_utf8_whole(char *s);

#endif
