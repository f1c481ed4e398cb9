//go:build race

package shm

import (
	"runtime"
	"unsafe"
)

// raceAccess tells the race detector what the kernel reads and writes:
// it cannot see into assembly.
func raceAccess(dst, src []byte) {
	runtime.RaceReadRange(unsafe.Pointer(unsafe.SliceData(src)), len(src))
	runtime.RaceWriteRange(unsafe.Pointer(unsafe.SliceData(dst)), len(dst))
}
