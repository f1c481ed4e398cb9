// Package cli runs a program made of subcommands (rewind, rewind-dev):
// PROGRAM COMMAND [flags], a context cancelled by SIGINT or SIGTERM, a
// command's error printed as one line, and the list of commands when none
// or an unknown one is named.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Command is one subcommand. A command without Usage is hidden from the
// list (a helper the program starts itself).
type Command struct {
	Name  string
	Usage string
	Run   func(ctx context.Context, args []string) error
}

// Main runs the command os.Args names and exits: 0 when it succeeded (or
// printed its flags for -h: flag.ErrHelp), 1 when it failed (its error on standard error, prefixed with program and
// command), 2 when no known command was named.
func Main(program string, commands []Command) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, program, commands, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, program string, commands []Command, args []string, stderr io.Writer) int {
	if len(args) > 0 {
		for _, c := range commands {
			if c.Name == args[0] {
				err := c.Run(ctx, args[1:])
				switch {
				case errors.Is(err, flag.ErrHelp): // -h: the command printed its flags
					return 0
				case err != nil:
					fmt.Fprintln(stderr, program+" "+c.Name+":", err)
					return 1
				}
				return 0
			}
		}
	}
	fmt.Fprintf(stderr, "usage: %s COMMAND [flags]\n\ncommands:\n", program)
	for _, c := range commands {
		if c.Usage != "" {
			fmt.Fprintf(stderr, "  %-12s %s\n", c.Name, c.Usage)
		}
	}
	fmt.Fprintf(stderr, "\n%s COMMAND -h shows a command's flags.\n", program)
	return 2
}
