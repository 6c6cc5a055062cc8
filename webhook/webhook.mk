# The webhook's headers live next to its sources; unit tests include them by name.
ALL_CFLAGS += -Iwebhook
