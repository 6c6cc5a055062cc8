/* Benchmark driver: extract layer files with the gkm extractor.
 *   extract_layer DEST LAYER...              into DEST (must exist)
 *   extract_layer --store ROOT DIGEST LAYER... through the content store
 *                                            (temp dir, syncfs, rename)
 * Prints one line of counters; exit status 0 on success. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "extract.h"
#include "store.h"

static int direct(const char *dest, int n, char **layers)
{
	int fd = open(dest, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct extract *x;
	if (fd < 0 || extract_new(fd, NULL, &x) < 0) {
		perror(dest);
		return 1;
	}
	int rc = 0;
	for (int i = 0; i < n && rc == 0; i++)
		rc = extract_layer_file(x, layers[i]);
	if (rc == 0)
		rc = extract_finish(x);
	struct extract_stats st;
	extract_get_stats(x, &st);
	if (rc < 0)
		fprintf(stderr, "extract: %s\n", extract_error(x));
	else
		printf("files=%llu bytes=%llu tar=%llu compressed=%llu\n",
		       (unsigned long long)st.files, (unsigned long long)st.bytes,
		       (unsigned long long)st.tar_bytes, (unsigned long long)st.compressed_bytes);
	extract_free(x);
	close(fd);
	return rc < 0;
}

static int via_store(const char *root, const char *digest, int n, char **layers)
{
	struct store *s;
	struct store_txn *t;
	char err[1024] = "";
	int rc = store_open(root, &s);
	if (rc == 0)
		rc = store_begin(s, digest, NULL, 0, &t);
	for (int i = 0; i < n && rc == 0; i++) {
		rc = extract_layer_file(store_txn_extract(t), layers[i]);
		if (rc < 0) {
			snprintf(err, sizeof(err), "%s", extract_error(store_txn_extract(t)));
			store_abort(t);
		}
	}
	struct store_entry_info info;
	if (rc == 0)
		rc = store_commit(t, &info, err, sizeof(err));
	if (rc < 0)
		fprintf(stderr, "store: %s %s\n", strerror(-rc), err);
	else
		printf("files=%llu bytes=%llu\n", (unsigned long long)info.files,
		       (unsigned long long)info.bytes);
	if (s)
		store_close(s);
	return rc < 0;
}

int main(int argc, char **argv)
{
	if (argc >= 5 && strcmp(argv[1], "--store") == 0)
		return via_store(argv[2], argv[3], argc - 4, argv + 4);
	if (argc >= 3 && argv[1][0] != '-')
		return direct(argv[1], argc - 2, argv + 2);
	fprintf(stderr, "usage: extract_layer DEST LAYER... | --store ROOT DIGEST LAYER...\n");
	return 2;
}
