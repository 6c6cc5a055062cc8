# The extraction benchmark's driver (spec/bench/extract.sh builds it with
# `make build/bench/extract_layer`). Objects are named here because this
# file is read before the Makefile collects LIB_OBJS.
EXTRACT_BENCH_OBJS := $(addprefix $(BUILD)/obj/core/,store/extract.o store/extract_decode.o store/extract_write.o base/fstree.o base/strmap.o store/store.o base/log.o base/progress.o base/fsutil.o)

$(BUILD)/bench/extract_layer: spec/bench/extract_layer.c $(EXTRACT_BENCH_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(PKG_LIBS)
