package main

import "context"

func runDemo(ctx context.Context, args []string) error      { return nil }
func runDemoTrain(ctx context.Context, args []string) error { return nil }
