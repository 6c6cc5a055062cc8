#!/bin/sh
# Emit an assembler file that embeds each named file byte for byte, plus a
# table gkm_embedded[] of {name, data, size} ending with a NULL name
# (see embedded.h). Names keep their path (lua/gkm/log.lua, policies/compat.lua).
set -eu
i=0
echo '.section .rodata'
for f in "$@"; do
	printf '.balign 16\nemb_name_%d: .asciz "%s"\nemb_data_%d: .incbin "%s"\nemb_end_%d: .byte 0\n' "$i" "$f" "$i" "$f" "$i"
	i=$((i + 1))
done
echo '.section .data.rel.ro'
echo '.balign 8'
echo '.globl gkm_embedded'
echo 'gkm_embedded:'
i=0
for f in "$@"; do
	printf '.quad emb_name_%d, emb_data_%d, emb_end_%d - emb_data_%d\n' "$i" "$i" "$i" "$i"
	i=$((i + 1))
done
echo '.quad 0, 0, 0'
echo '.section .note.GNU-stack,"",@progbits'
