// Package flagx parses the benchmark commands' list flags ("1,16,64", "river,temporal") and
// environment defaults, the same way for every command.
package flagx

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// List splits a comma-separated flag value into its non-empty, trimmed items.
func List(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// Ints parses a non-empty list of positive integers.
func Ints(s string) ([]int, error) {
	var out []int
	for _, f := range List(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

// Floats parses a list of positive numbers.
func Floats(s string) ([]float64, error) {
	var out []float64
	for _, f := range List(s) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, v)
	}
	return out, nil
}

// Choices parses a list whose items must be among allowed, in the order given.
func Choices(s string, allowed ...string) ([]string, error) {
	out := List(s)
	for _, v := range out {
		if !slices.Contains(allowed, v) {
			return nil, fmt.Errorf("unknown %q (%s)", v, strings.Join(allowed, ", "))
		}
	}
	return out, nil
}

// Set is Choices as a set.
func Set(s string, allowed ...string) (map[string]bool, error) {
	list, err := Choices(s, allowed...)
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for _, v := range list {
		set[v] = true
	}
	return set, nil
}

// EnvOr is the environment variable k, or def when it is unset or empty.
func EnvOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
