package shm

import "fmt"

// DType is a tensor element type, named as in the safetensors specification.
type DType string

// The element types a shard may hold.
const (
	Bool    DType = "BOOL"
	U8      DType = "U8"
	I8      DType = "I8"
	F8E5M2  DType = "F8_E5M2"
	F8E4M3  DType = "F8_E4M3"
	I16     DType = "I16"
	U16     DType = "U16"
	F16     DType = "F16"
	BF16    DType = "BF16"
	I32     DType = "I32"
	U32     DType = "U32"
	F32     DType = "F32"
	F64     DType = "F64"
	I64     DType = "I64"
	U64     DType = "U64"
	C64     DType = "C64"
	dtypeNA DType = ""
)

var dtypeSizes = map[DType]int64{
	Bool: 1, U8: 1, I8: 1, F8E5M2: 1, F8E4M3: 1,
	I16: 2, U16: 2, F16: 2, BF16: 2,
	I32: 4, U32: 4, F32: 4,
	F64: 8, I64: 8, U64: 8, C64: 8,
}

// Size returns the size of one element in bytes, or 0 for an unknown type.
func (d DType) Size() int64 { return dtypeSizes[d] }

// Valid reports whether d is a known element type.
func (d DType) Valid() bool { return d.Size() > 0 }

// ParseDType checks a dtype name.
func ParseDType(s string) (DType, error) {
	d := DType(s)
	if !d.Valid() {
		return dtypeNA, fmt.Errorf("shm: unknown dtype %q", s)
	}
	return d, nil
}

// NumBytes returns the byte size of a tensor of this type and shape, or an
// error for a negative dimension or a size that overflows.
func (d DType) NumBytes(shape []int64) (int64, error) {
	if !d.Valid() {
		return 0, fmt.Errorf("shm: unknown dtype %q", string(d))
	}
	n := d.Size()
	for _, dim := range shape {
		if dim < 0 {
			return 0, fmt.Errorf("shm: negative dimension %d in shape %v", dim, shape)
		}
		if dim != 0 && n > maxTensorBytes/dim {
			return 0, fmt.Errorf("shm: shape %v of %s overflows", shape, d)
		}
		n *= dim
	}
	return n, nil
}

// maxTensorBytes bounds one tensor (1 PiB), far above any real shard, so that
// size arithmetic cannot overflow int64.
const maxTensorBytes = 1 << 50
