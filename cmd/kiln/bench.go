package main

import "fmt"

func cmdBench(args []string) error {
	return fmt.Errorf("not yet")
}
