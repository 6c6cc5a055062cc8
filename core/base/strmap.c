/* String -> pointer hash map (see strmap.h). */
#include "strmap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

uint32_t strmap_hash(const char *s)
{
	uint32_t h = 2166136261u; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

static size_t find_slot(const struct strmap *m, const char *key, uint32_t h)
{
	size_t mask = m->cap - 1, i = h & mask;
	while (m->slots[i].key && (m->slots[i].hash != h || strcmp(m->slots[i].key, key) != 0))
		i = (i + 1) & mask;
	return i;
}

void *strmap_get(const struct strmap *m, const char *key)
{
	if (!m->len)
		return NULL;
	size_t i = find_slot(m, key, strmap_hash(key));
	return m->slots[i].key ? m->slots[i].val : NULL;
}

static int resize(struct strmap *m, size_t cap)
{
	struct strmap_slot *s = calloc(cap, sizeof(*s));
	if (!s)
		return -ENOMEM;
	struct strmap old = *m;
	m->slots = s;
	m->cap = cap;
	for (size_t i = 0; i < old.cap; i++) {
		if (old.slots[i].key) {
			size_t j = find_slot(m, old.slots[i].key, old.slots[i].hash);
			m->slots[j] = old.slots[i];
		}
	}
	free(old.slots);
	return 0;
}

int strmap_put(struct strmap *m, const char *key, void *val)
{
	/* at most three quarters full */
	if ((m->len + 1) * 4 > m->cap * 3 && resize(m, m->cap ? m->cap * 2 : 16) != 0)
		return -ENOMEM;
	uint32_t h = strmap_hash(key);
	size_t i = find_slot(m, key, h);
	if (!m->slots[i].key)
		m->len++;
	m->slots[i].key = key;
	m->slots[i].val = val;
	m->slots[i].hash = h;
	return 0;
}

void *strmap_del(struct strmap *m, const char *key)
{
	if (!m->len)
		return NULL;
	size_t mask = m->cap - 1, i = find_slot(m, key, strmap_hash(key));
	if (!m->slots[i].key)
		return NULL;
	void *val = m->slots[i].val;
	/* backward shift: move up what probed past the hole */
	for (size_t j = (i + 1) & mask; m->slots[j].key; j = (j + 1) & mask) {
		size_t home = m->slots[j].hash & mask;
		/* j may move to i only if its home is not in (i, j] */
		if (((j - home) & mask) >= ((j - i) & mask)) {
			m->slots[i] = m->slots[j];
			i = j;
		}
	}
	memset(&m->slots[i], 0, sizeof(m->slots[i]));
	m->len--;
	return val;
}

bool strmap_next(const struct strmap *m, size_t *pos, const char **key, void **val)
{
	for (; *pos < m->cap; (*pos)++) {
		if (m->slots[*pos].key) {
			if (key)
				*key = m->slots[*pos].key;
			if (val)
				*val = m->slots[*pos].val;
			(*pos)++;
			return true;
		}
	}
	return false;
}

void strmap_clear(struct strmap *m)
{
	free(m->slots);
	memset(m, 0, sizeof(*m));
}
