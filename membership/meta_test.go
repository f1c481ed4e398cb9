package membership

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestMetaRoundTrip(t *testing.T) {
	type testcase struct {
		meta    Meta
		leaving bool
	}
	run := func(t *testing.T, tc testcase) {
		b, err := tc.meta.encode(tc.leaving)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > MetaMaxSize {
			t.Fatalf("%d bytes encoded, limit %d", len(b), MetaMaxSize)
		}
		got, leaving, err := decodeMeta(b)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.meta || leaving != tc.leaving {
			t.Fatalf("decoded %+v leaving %v, want %+v leaving %v", got, leaving, tc.meta, tc.leaving)
		}
	}
	for name, tc := range map[string]testcase{
		"agent":          {meta: Meta{Role: RoleAgent, Domain: "rack-7/switch-2", GRPCAddr: "10.0.3.17:7070"}},
		"coordinator":    {meta: Meta{Role: RoleCoordinator, GRPCAddr: "[fd00::1]:7080"}},
		"empty fields":   {meta: Meta{Role: RoleAgent}},
		"leaving":        {meta: Meta{Role: RoleAgent, Domain: "r1"}, leaving: true},
		"unicode domain": {meta: Meta{Role: RoleAgent, Domain: "zone-ß/机架-3"}},
		"largest":        {meta: Meta{Role: RoleAgent, Domain: strings.Repeat("d", 250), GRPCAddr: strings.Repeat("a", 250)}},
	} {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}

func TestMetaEncodeErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		meta Meta
		want string
	}{
		"no role":      {Meta{}, `role "" is neither`},
		"unknown role": {Meta{Role: "trainer"}, `role "trainer"`},
		"too long":     {Meta{Role: RoleAgent, Domain: strings.Repeat("d", 400), GRPCAddr: strings.Repeat("a", 200)}, "limit 512"},
		"not utf-8":    {Meta{Role: RoleAgent, Domain: "\xff"}, "not UTF-8"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.meta.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestMetaDecodeErrors(t *testing.T) {
	good, err := Meta{Role: RoleAgent, Domain: "r1", GRPCAddr: "h:1"}.encode(false)
	if err != nil {
		t.Fatal(err)
	}
	with := func(i int, v byte) []byte {
		b := bytes.Clone(good)
		b[i] = v
		return b
	}
	for name, tc := range map[string]struct {
		in   []byte
		want string
	}{
		"empty":             {nil, "empty"},
		"newer version":     {with(0, 2), "version 2"},
		"truncated":         {good[:2], "truncated before the flags"},
		"unknown role":      {with(1, 9), "role byte 9"},
		"unknown flag":      {with(2, 0x80), "flags 0x80"},
		"length past end":   {with(3, 100), "failure domain: length 100"},
		"truncated address": {good[:len(good)-1], "gRPC address: length 3, only 2"},
		"trailing bytes":    {append(bytes.Clone(good), 0), "1 trailing bytes"},
		"bad utf-8":         {append([]byte{1, 1, 0, 1, 0xff}, 0), "not UTF-8"},
		"overlong length":   {[]byte{1, 1, 0, 0x80, 0x00, 0}, "not minimally encoded"},
		"too large":         {append(bytes.Clone(good), make([]byte, MetaMaxSize)...), "limit 512"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := decodeMeta(tc.in)
			if !errors.Is(err, ErrBadMeta) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrBadMeta containing %q", err, tc.want)
			}
		})
	}
}

// FuzzDecodeMeta: any bytes a peer sends decode or fail with ErrBadMeta,
// and what decodes encodes back to the same bytes.
func FuzzDecodeMeta(f *testing.F) {
	for _, m := range []Meta{{Role: RoleAgent, Domain: "r1", GRPCAddr: "10.0.0.1:7070"}, {Role: RoleCoordinator}} {
		b, _ := m.encode(false)
		f.Add(b)
	}
	f.Add([]byte{1, 2, 1, 0x80, 0x80})
	f.Add([]byte{1, 1, 0, 0x80, 0x00, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, leaving, err := decodeMeta(b)
		if err != nil {
			if !errors.Is(err, ErrBadMeta) {
				t.Fatalf("error %v does not wrap ErrBadMeta", err)
			}
			return
		}
		again, err := m.encode(leaving)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("%x decoded to %+v, which encodes to %x", b, m, again)
		}
	})
}
