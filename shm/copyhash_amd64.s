#include "textflag.h"

// func accumCopyAVX2(acc *[8]uint64, dst, src *byte, blocks int, secret *byte)
//
// Per 64-byte stripe: two 32-byte loads from src, two non-temporal stores
// to dst, and XXH3's accumulation from the same registers: for each
// 64-bit lane i, acc[i^1] += v[i] and acc[i] += lo32(k)*hi32(k) with
// k = v[i] ^ secret[s*8+8i]. After 16 stripes (a block) each lane is
// scrambled: a ^= a>>47; a ^= secret[128+8i]; a *= PRIME32_1.
TEXT ·accumCopyAVX2(SB), NOSPLIT, $0-40
	MOVQ acc+0(FP), AX
	MOVQ dst+8(FP), DI
	MOVQ src+16(FP), SI
	MOVQ blocks+24(FP), CX
	MOVQ secret+32(FP), R8

	VMOVDQU (AX), Y0
	VMOVDQU 32(AX), Y1
	MOVQ    $2654435761, R11
	VMOVQ   R11, X2
	VPBROADCASTQ X2, Y2

block:
	MOVQ R8, R9
	MOVQ $16, R10

stripe:
	VMOVDQU  (SI), Y3
	VMOVDQU  32(SI), Y4
	VMOVNTDQ Y3, (DI)
	VMOVNTDQ Y4, 32(DI)
	VPXOR    (R9), Y3, Y5
	VPXOR    32(R9), Y4, Y6
	VPSRLQ   $32, Y5, Y7
	VPSRLQ   $32, Y6, Y8
	VPMULUDQ Y7, Y5, Y5
	VPMULUDQ Y8, Y6, Y6
	VPSHUFD  $0x4e, Y3, Y3
	VPSHUFD  $0x4e, Y4, Y4
	VPADDQ   Y3, Y0, Y0
	VPADDQ   Y4, Y1, Y1
	VPADDQ   Y5, Y0, Y0
	VPADDQ   Y6, Y1, Y1
	ADDQ     $64, SI
	ADDQ     $64, DI
	ADDQ     $8, R9
	DECQ     R10
	JNZ      stripe

	VPSRLQ   $47, Y0, Y5
	VPSRLQ   $47, Y1, Y6
	VPXOR    Y5, Y0, Y0
	VPXOR    Y6, Y1, Y1
	VPXOR    128(R8), Y0, Y0
	VPXOR    160(R8), Y1, Y1
	VPSRLQ   $32, Y0, Y5
	VPSRLQ   $32, Y1, Y6
	VPMULUDQ Y2, Y0, Y0
	VPMULUDQ Y2, Y1, Y1
	VPMULUDQ Y2, Y5, Y5
	VPMULUDQ Y2, Y6, Y6
	VPSLLQ   $32, Y5, Y5
	VPSLLQ   $32, Y6, Y6
	VPADDQ   Y5, Y0, Y0
	VPADDQ   Y6, Y1, Y1
	DECQ     CX
	JNZ      block

	VMOVDQU Y0, (AX)
	VMOVDQU Y1, 32(AX)
	SFENCE
	VZEROUPPER
	RET
