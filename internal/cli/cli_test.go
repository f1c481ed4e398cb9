package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	var got []string
	cmds := []Command{
		{"ok", "succeeds", func(_ context.Context, args []string) error { got = args; return nil }},
		{"bad", "fails", func(context.Context, []string) error { return errors.New("it broke") }},
		{"hidden", "", func(context.Context, []string) error { return nil }},
		{"help", "prints its flags", func(context.Context, []string) error { return flag.ErrHelp }},
	}
	cases := map[string]struct {
		args []string
		code int
		out  []string // in the output
		not  []string // not in it
	}{
		"runs with its args": {[]string{"ok", "-x", "1"}, 0, nil, []string{"usage"}},
		"error on one line":  {[]string{"bad"}, 1, []string{"prog bad: it broke\n"}, []string{"usage"}},
		"no command":         {nil, 2, []string{"usage: prog COMMAND", "ok ", "succeeds"}, []string{"hidden"}},
		"unknown command":    {[]string{"nope"}, 2, []string{"usage: prog COMMAND"}, nil},
		"-h is no failure":   {[]string{"help", "-h"}, 0, nil, []string{"usage", "help:"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			if code := run(t.Context(), "prog", cmds, tc.args, &out); code != tc.code {
				t.Fatalf("exit %d, want %d (%s)", code, tc.code, out.String())
			}
			for _, s := range tc.out {
				if !strings.Contains(out.String(), s) {
					t.Errorf("output %q lacks %q", out.String(), s)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(out.String(), s) {
					t.Errorf("output %q has %q", out.String(), s)
				}
			}
		})
	}
	if strings.Join(got, " ") != "-x 1" {
		t.Fatalf("ok got args %q", got)
	}
}
