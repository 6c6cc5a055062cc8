/* Progress of the long steps of a command (packing a tree, uploading,
 * copying, extracting), shown the way skopeo and podman show theirs.
 *
 * The command names the stage it starts (progress_begin) and ends it
 * (progress_end). The code that moves the bytes reports them where they
 * pass (progress_add), whoever called it and from any thread: with no stage
 * begun a report is one atomic load and nothing else, so the daemons, which
 * never begin one, pay nothing.
 *
 * What a stage shows depends on where stderr goes:
 *   - --log-format json: one log line when the stage ends (msg "stage
 *     done"; stage, result, bytes, files, seconds, and totalBytes when the
 *     total was known), never a meter;
 *   - a terminal (TERM not "dumb"): one line redrawn in place ("\r") at
 *     most 10 times a second: the bytes done, of the total with a
 *     percentage and an ETA when the total is known, the files, the rate
 *     over the last seconds; then a final line with the totals. Log lines
 *     written meanwhile erase the meter first, and it is drawn again below;
 *   - anything else (a pipe, a file): nothing.
 *
 * One stage at a time (a command's steps follow one another). */
#ifndef GKM_PROGRESS_H
#define GKM_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

/* Where bytes and files are reported; a stage counts the kinds it names. */
enum progress_kind {
	PROGRESS_READ = 1u << 0,      /* blob bytes read and verified */
	PROGRESS_SENT = 1u << 1,      /* blob bytes uploaded to a registry */
	PROGRESS_PRESENT = 1u << 2,   /* blobs the destination had: done, none moved */
	PROGRESS_PACKED = 1u << 3,    /* files, and their bytes, written into a layer */
	PROGRESS_EXTRACTED = 1u << 4, /* files an extraction wrote */
};

/* Start stage (a short word: "pack", "push"; borrowed until progress_end)
 * counting the kinds in the mask. total: the bytes expected, 0 when not
 * known (bytes and rate only). passes: how many times each byte of the
 * total is reported (a copy between two registries reads each blob into a
 * temporary file, then sends it: 2, and counts half of each); 0 means 1. A
 * stage still running is ended first. */
void progress_begin(const char *stage, unsigned kinds, unsigned passes, uint64_t total);
/* The total grows by bytes (code that learns the sizes as it goes). */
void progress_add_total(uint64_t bytes);
/* bytes and files of kind moved (ignored unless a stage counting kind runs). */
void progress_add(enum progress_kind kind, uint64_t bytes, uint64_t files);
/* End the stage: rc 0 done, else stopped (the caller says why). */
void progress_end(int rc);

/* "1.5 MiB", "512 B" into buf. */
void progress_human(uint64_t n, char *buf, size_t cap);

#endif
