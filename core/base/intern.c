/* Reference-counted string interning (see intern.h). */
#include "intern.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct istr {
	uint32_t refs;
	char s[];
};

static struct istr *of(const char *s)
{
	return (struct istr *)(void *)(s - offsetof(struct istr, s));
}

const char *intern_get(struct intern *t, const char *s)
{
	struct istr *is = strmap_get(&t->map, s);
	if (is) {
		is->refs++;
		return is->s;
	}
	size_t len = strlen(s);
	is = malloc(sizeof(*is) + len + 1);
	if (!is)
		return NULL;
	is->refs = 1;
	memcpy(is->s, s, len + 1);
	if (strmap_put(&t->map, is->s, is) != 0) {
		free(is);
		return NULL;
	}
	t->bytes += len + 1;
	return is->s;
}

const char *intern_ref(const char *s)
{
	if (s)
		of(s)->refs++;
	return s;
}

void intern_put(struct intern *t, const char *s)
{
	if (!s)
		return;
	struct istr *is = of(s);
	if (--is->refs)
		return;
	strmap_del(&t->map, is->s);
	t->bytes -= strlen(is->s) + 1;
	free(is);
}

size_t intern_count(const struct intern *t)
{
	return t->map.len;
}

void intern_clear(struct intern *t)
{
	strmap_clear(&t->map);
	t->bytes = 0;
}
