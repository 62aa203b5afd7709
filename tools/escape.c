/* Text into JSON and XML (tools/escape.h). */
#include "tools/escape.h"

#include <string.h>

#include "model/tokenizer.h"

void cli_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        const int n = fgm_utf8_length((const char *)p);
        if (n == 0)
            fputs("\\ufffd", f);
        else if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\u%04x", *p);
        else
            fwrite(p, 1, (size_t)n, f);
        p += n ? n : 1;
    }
    fputc('"', f);
}

void cli_xml_text(FILE *f, const char *s) {
    static const char replacement[] = "\xef\xbf\xbd"; /* U+FFFD */
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        const int n = fgm_utf8_length((const char *)p);
        if (n == 0 || (*p < 0x20 && *p != '\t' && *p != '\n' && *p != '\r') || *p == 0x7f)
            fputs(replacement, f);
        else if (*p == '&')
            fputs("&amp;", f);
        else if (*p == '<')
            fputs("&lt;", f);
        else if (*p == '>')
            fputs("&gt;", f);
        else if (*p == '"')
            fputs("&quot;", f);
        else if (*p == '\'')
            fputs("&apos;", f);
        else
            fwrite(p, 1, (size_t)n, f);
        p += n ? n : 1;
    }
}

char *cli_utf8_whole(char *s) {
    size_t len = strlen(s), start = len;
    while (start > 0 && len - start < 4 && ((unsigned char)s[start - 1] & 0xc0) == 0x80)
        start--; /* back over continuation bytes to the sequence's lead */
    if (start > 0 && ((unsigned char)s[start - 1] & 0xc0) == 0xc0) {
        const unsigned char lead = (unsigned char)s[start - 1];
        const size_t want = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : 2;
        if (len - (start - 1) < want)
            s[start - 1] = '\0';
    }
    return s;
}
