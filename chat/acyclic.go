package chat

// A template can make a value hold itself: {% set ns.a = ns %} stores a
// namespace (a Go map in gonja) inside itself, and so can a cycler or a
// macro's kwargs, the other maps a template can write into. Printing such
// a value, converting it for a method call or sorting it then recurses
// until the goroutine's stack overflows, and Go ends the process on that
// (no recover): such a chat template in a model's files would kill the
// server at the first request that renders it (found by FuzzRender). So
// every {% set %} that writes into an attribute or an item of a variable
// is followed by a check that nothing reachable from that variable holds
// itself, and the rendering fails with an error where something does.

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// errHoldsItself is the error of a rendering that made a value hold
// itself.
var errHoldsItself = errors.New("a value holds itself")

// maxValueDepth bounds the check's walk: a value nested deeper is refused
// as well (a template builds one level a {% set %}).
const maxValueDepth = 10000

// acyclicSetParser wraps gonja's set parser: a statement whose target is
// an attribute or an item of a variable ({% set ns.a = ... %},
// {% set ns['a'] = ... %}) gets acyclicSet around it.
func acyclicSetParser(set parser.ControlStructureParser) parser.ControlStructureParser {
	return func(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
		root := ""
		if name := args.Current(tokens.Name); name != nil && args.Peek(tokens.Dot, tokens.LeftBracket) != nil {
			root = name.Val
		}
		cs, err := set(p, args)
		if err != nil || root == "" {
			return cs, err
		}
		inner, ok := cs.(exec.ControlStructure)
		if !ok {
			return cs, nil
		}
		return &acyclicSet{ControlStructure: inner, root: root}, nil
	}
}

// acyclicSet runs the statement, then refuses a value reachable from the
// variable root that holds itself.
type acyclicSet struct {
	exec.ControlStructure
	root string
}

func (s *acyclicSet) Execute(r *exec.Renderer, tag *nodes.ControlStructureBlock) error {
	if err := s.ControlStructure.Execute(r, tag); err != nil {
		return err
	}
	v, ok := r.Environment.Context.Get(s.root)
	if !ok {
		return nil
	}
	if err := checkAcyclic(v); err != nil {
		return fmt.Errorf("set %s…: %w", s.root, err)
	}
	return nil
}

// checkAcyclic walks the maps, lists and dicts reachable from v and
// returns errHoldsItself where a map is reached again from inside itself
// (maps are the only values a template can write into, so every cycle
// passes through one).
func checkAcyclic(v any) error {
	const onPath, done = 1, 2
	state := map[uintptr]int8{}
	var walk func(rv reflect.Value, depth int) error
	walk = func(rv reflect.Value, depth int) error {
		if depth > maxValueDepth {
			return fmt.Errorf("a value nested deeper than %d levels", maxValueDepth)
		}
		for rv.IsValid() && (rv.Kind() == reflect.Interface || rv.Kind() == reflect.Pointer) {
			if rv.IsNil() {
				return nil
			}
			switch x := rv.Interface().(type) {
			case *exec.Value:
				rv = x.Val
				continue
			case *exec.Dict:
				for _, p := range x.Pairs {
					if p != nil && p.Value != nil {
						if err := walk(p.Value.Val, depth+1); err != nil {
							return err
						}
					}
				}
				return nil
			}
			rv = rv.Elem()
		}
		if !rv.IsValid() {
			return nil
		}
		switch rv.Kind() {
		case reflect.Map:
			id := rv.Pointer()
			switch state[id] {
			case onPath:
				return errHoldsItself
			case done:
				return nil
			}
			state[id] = onPath
			for it := rv.MapRange(); it.Next(); {
				if err := walk(it.Value(), depth+1); err != nil {
					return err
				}
			}
			state[id] = done
		case reflect.Slice, reflect.Array:
			for i := range rv.Len() {
				if err := walk(rv.Index(i), depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(reflect.ValueOf(v), 0)
}
