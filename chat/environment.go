package chat

// The Jinja environment transformers renders chat templates in, rebuilt on
// gonja: transformers' additions (raise_exception, strftime_now, tojson as
// json.dumps, the {% generation %} tag) and Python's behaviour where gonja's
// builtins differ from jinja2's (str methods, str(), items() order, the
// true/false tests, title, trim). Everything here is shared by all templates
// and never changed after init, so templates may render concurrently.

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// jinjaConfig is jinja2's configuration as transformers sets it:
// trim_blocks=True, lstrip_blocks=True, no autoescape, a trailing newline
// dropped.
func jinjaConfig() *config.Config {
	c := config.New()
	c.TrimBlocks = true
	c.LeftStripBlocks = true
	return c
}

var environment = newEnvironment()

func newEnvironment() *exec.Environment {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	for name, fn := range map[string]exec.FilterFunction{
		"tojson":     filterToJSON,
		"string":     filterString,
		"items":      filterItems,
		"trim":       filterTrim,
		"title":      filterTitle,
		"capitalize": filterCapitalize,
		"upper":      filterUpper,
		"lower":      filterLower,
		"dictsort":   filterDictSort,
	} {
		must(filters.Replace(name, fn))
	}

	tests := exec.NewTestSet(map[string]exec.TestFunction{}).Update(builtins.Tests)
	for name, fn := range map[string]exec.TestFunction{
		"true":     testTrue,
		"false":    testFalse,
		"sequence": testSequence,
	} {
		must(tests.Replace(name, fn))
	}

	structures := exec.NewControlStructureSet(map[string]parser.ControlStructureParser{}).Update(builtins.ControlStructures)
	must(structures.Register("generation", generationParser))
	set, ok := structures.Get("set")
	if !ok {
		panic("chat: gonja has no set statement")
	}
	must(structures.Replace("set", acyclicSetParser(set)))

	ctx := exec.EmptyContext().Update(builtins.GlobalFunctions)
	ctx.Set("range", rangeFunction)
	ctx.Set(ifElseName, ifElse) // rewriteConditionals' calls

	return &exec.Environment{
		Context:           ctx,
		Filters:           filters,
		Tests:             tests,
		ControlStructures: structures,
		Methods: exec.Methods{
			Bool:  builtins.Methods.Bool,
			Int:   builtins.Methods.Int,
			Float: builtins.Methods.Float,
			Str:   strMethods(),
			Dict:  dictMethods(),
			List:  builtins.Methods.List,
		},
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// sourceLoader serves the one template it holds; {% include %}, {% import %}
// and {% extends %} find nothing, as in transformers' loader-less
// environment.
type sourceLoader struct{ source string }

const templateName = "chat_template"

func (l sourceLoader) Read(path string) (io.Reader, error) {
	if path != templateName {
		return nil, fmt.Errorf("template %q not found: chat templates cannot load other templates", path)
	}
	return strings.NewReader(l.source), nil
}
func (l sourceLoader) Resolve(path string) (string, error)         { return path, nil }
func (l sourceLoader) Inherit(from string) (loaders.Loader, error) { return l, nil }

// generationBlock is transformers' {% generation %}...{% endgeneration %}:
// it marks the assistant's part for training masks and renders its body
// unchanged.
type generationBlock struct {
	location *tokens.Token
	body     *nodes.Wrapper
}

func (g *generationBlock) Position() *tokens.Token { return g.location }
func (g *generationBlock) String() string {
	return fmt.Sprintf("generation(Line=%d Col=%d)", g.location.Line, g.location.Col)
}
func (g *generationBlock) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	return r.ExecuteWrapper(g.body)
}

func generationParser(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
	g := &generationBlock{location: p.Current()}
	if !args.End() {
		return nil, args.Error("generation takes no arguments", args.Current())
	}
	body, endargs, err := p.WrapUntil("endgeneration")
	if err != nil {
		return nil, err
	}
	if !endargs.End() {
		return nil, endargs.Error("endgeneration takes no arguments", endargs.Current())
	}
	g.body = body
	return g, nil
}

// maxRange bounds range() so that a template cannot ask for unbounded work.
const maxRange = 1 << 20

// rangeFunction is Python's range as a list (gonja's streams through a
// goroutine that leaks when a loop breaks early).
func rangeFunction(va *exec.VarArgs) (any, error) {
	var start, stop, step = 0, 0, 1
	ints := make([]int, len(va.Args))
	for i, a := range va.Args {
		if !a.IsInteger() {
			return nil, fmt.Errorf("range: %s object cannot be interpreted as an integer", pyTypeName(a))
		}
		ints[i] = a.Integer()
	}
	switch len(ints) {
	case 1:
		stop = ints[0]
	case 2:
		start, stop = ints[0], ints[1]
	case 3:
		start, stop, step = ints[0], ints[1], ints[2]
	default:
		return nil, fmt.Errorf("range expected 1 to 3 arguments, got %d", len(ints))
	}
	if step == 0 {
		return nil, fmt.Errorf("range() arg 3 must not be zero")
	}
	out := []any{}
	for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
		if len(out) == maxRange {
			return nil, fmt.Errorf("range: more than %d items", maxRange)
		}
		out = append(out, i)
	}
	return out, nil
}

// argument returns the i-th positional argument or the keyword one called
// name.
func argument(va *exec.VarArgs, i int, name string) (*exec.Value, bool) {
	if i < len(va.Args) {
		return va.Args[i], true
	}
	v, ok := va.KwArgs[name]
	return v, ok
}

// filterToJSON is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False).
func filterToJSON(_ *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	o := jsonOptions{}
	if v, ok := argument(va, 0, "ensure_ascii"); ok {
		o.ensureASCII = v.IsTrue()
	}
	if v, ok := argument(va, 1, "indent"); ok && !v.IsNil() {
		var s string
		switch {
		case v.IsString():
			s = v.String()
		case v.IsInteger():
			s = strings.Repeat(" ", max(0, v.Integer()))
		default:
			return exec.AsValue(fmt.Errorf("tojson: indent must be an int or a str"))
		}
		o.indent = &s
	}
	o.itemSep, o.keySep = ", ", ": "
	if o.indent != nil {
		o.itemSep = ","
	}
	if v, ok := argument(va, 2, "separators"); ok && !v.IsNil() {
		if !v.IsList() || v.Len() != 2 {
			return exec.AsValue(fmt.Errorf("tojson: separators must be a pair of strings"))
		}
		o.itemSep, o.keySep = listItem(v, 0).String(), listItem(v, 1).String()
	}
	if v, ok := argument(va, 3, "sort_keys"); ok {
		o.sortKeys = v.IsTrue()
	}
	s, err := pyJSON(in, o)
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsValue(s)
}

// filterString is str(x).
func filterString(_ *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	s, err := pyStr(in)
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsValue(s)
}

// filterItems is jinja2's items: a mapping's (key, value) pairs in its
// order.
func filterItems(_ *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	switch {
	case in.IsError():
		return in
	case in.IsNil():
		return exec.AsValue([]any{})
	case !in.IsDict():
		return exec.AsValue(fmt.Errorf("items: can only get item pairs from a mapping, not %s", pyTypeName(in)))
	}
	return exec.AsValue(pairList(in))
}

func pairList(in *exec.Value) []any {
	pairs := dictPairs(in)
	out := make([]any, len(pairs))
	for i, p := range pairs {
		out[i] = []any{p.Key.Interface(), p.Value.Interface()}
	}
	return out
}

// pyWhitespace is what Python's str.strip() removes by default.
func pyWhitespace(r rune) bool {
	switch r {
	case '\x1c', '\x1d', '\x1e', '\x1f', '\x85':
		return true
	}
	return unicode.IsSpace(r)
}

func pyStrip(s string, chars *exec.Value, left, right bool) string {
	cut := pyWhitespace
	if chars != nil && !chars.IsNil() {
		set := chars.String()
		cut = func(r rune) bool { return strings.ContainsRune(set, r) }
	}
	if left {
		s = strings.TrimLeftFunc(s, cut)
	}
	if right {
		s = strings.TrimRightFunc(s, cut)
	}
	return s
}

// filterTrim is jinja2's trim: str.strip(chars).
func filterTrim(_ *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	s, err := pyStr(in)
	if err != nil {
		return exec.AsValue(err)
	}
	chars, _ := argument(va, 0, "chars")
	return exec.AsValue(pyStrip(s, chars, true, true))
}

// pyTitle is Python's str.title: a letter after a cased letter is lower
// case, any other letter upper (title) case.
func pyTitle(s string) string {
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			b.WriteString(pyLower(string(r)))
		} else if u, ok := specialUpper[r]; ok {
			// Title case of a ligature or ß is its first letter upper only.
			rs := []rune(u)
			b.WriteString(string(rs[0]) + pyLower(string(rs[1:])))
		} else {
			b.WriteRune(unicode.ToTitle(r))
		}
		prevCased = unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r)
	}
	return b.String()
}

// pyCapitalize is Python's str.capitalize: the first character in title
// case, the rest lower case.
func pyCapitalize(s string) string {
	for i, r := range s {
		return pyTitle(string(r)) + pyLower(s[i+utf8.RuneLen(r):])
	}
	return s
}

// jinjaTitle is jinja2's title filter (not str.title): each word, split
// at whitespace, '-', '(', '{', '[' and '<', gets its first character upper
// case and the rest lower case, so "it's" becomes "It's".
func jinjaTitle(s string) string {
	var b strings.Builder
	start := true
	for _, r := range s {
		if unicode.IsSpace(r) || strings.ContainsRune("-({[<", r) {
			b.WriteRune(r)
			start = true
			continue
		}
		if start {
			b.WriteString(pyUpper(string(r)))
		} else {
			b.WriteString(pyLower(string(r)))
		}
		start = false
	}
	return b.String()
}

func filterTitle(_ *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	return exec.AsValue(jinjaTitle(in.String()))
}

func filterUpper(_ *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	return exec.AsValue(pyUpper(in.String()))
}

func filterLower(_ *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	return exec.AsValue(pyLower(in.String()))
}

// specialUpper are the full case mappings Python applies in str.upper and
// Go's simple mapping lacks (Unicode SpecialCasing.txt, unconditional).
var specialUpper = map[rune]string{
	'ß': "SS", 'ŉ': "ʼN", 'ǰ': "J̌", 'ΐ': "Ϊ́", 'ΰ': "Ϋ́", 'և': "ԵՒ",
	'ﬀ': "FF", 'ﬁ': "FI", 'ﬂ': "FL", 'ﬃ': "FFI", 'ﬄ': "FFL", 'ﬅ': "ST", 'ﬆ': "ST",
}

// pyUpper is Python's str.upper.
func pyUpper(s string) string {
	var b strings.Builder
	for _, r := range s {
		if u, ok := specialUpper[r]; ok {
			b.WriteString(u)
		} else {
			b.WriteRune(unicode.ToUpper(r))
		}
	}
	return b.String()
}

// pyLower is Python's str.lower: as Go's but for İ, which becomes i and a
// combining dot above, and final sigma, which Python writes as ς at the end
// of a word.
func pyLower(s string) string {
	if !strings.ContainsAny(s, "İΣ") {
		return strings.ToLower(s)
	}
	rs := []rune(s)
	var b strings.Builder
	for i, r := range rs {
		switch {
		case r == 'İ':
			b.WriteString("i\u0307")
		case r == 'Σ' && finalSigma(rs, i):
			b.WriteRune('ς')
		default:
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String()
}

// finalSigma is Unicode's Final_Sigma condition, as Python tests it: a cased
// letter (skipping case-ignorable ones) before, none after.
func finalSigma(rs []rune, i int) bool {
	cased := func(r rune) bool { return unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r) }
	ignorable := func(r rune) bool {
		return unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf, unicode.Lm, unicode.Sk) || strings.ContainsRune("'.:^`\u00ad\u00b7\u2018\u2019\u2024\u2027", r)
	}
	j := i - 1
	for j >= 0 && ignorable(rs[j]) {
		j--
	}
	if j < 0 || !cased(rs[j]) {
		return false
	}
	j = i + 1
	for j < len(rs) && ignorable(rs[j]) {
		j++
	}
	return j == len(rs) || !cased(rs[j])
}

// filterDictSort is jinja2's dictsort(case_sensitive=False, by='key',
// reverse=False): a mapping's (key, value) pairs, sorted.
func filterDictSort(_ *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	if !in.IsDict() {
		return exec.AsValue(fmt.Errorf("dictsort: %s is not a mapping", pyTypeName(in)))
	}
	caseSensitive, byValue, reverse := false, false, false
	if v, ok := argument(va, 0, "case_sensitive"); ok {
		caseSensitive = v.IsTrue()
	}
	if v, ok := argument(va, 1, "by"); ok {
		switch v.String() {
		case "key":
		case "value":
			byValue = true
		default:
			return exec.AsValue(fmt.Errorf("dictsort: you can only sort by either \"key\" or \"value\""))
		}
	}
	if v, ok := argument(va, 2, "reverse"); ok {
		reverse = v.IsTrue()
	}
	pairs := dictPairs(in)
	var err error
	slices.SortStableFunc(pairs, func(x, y *exec.Pair) int {
		a, b := x.Key, y.Key
		if byValue {
			a, b = x.Value, y.Value
		}
		c, e := pyCompare(a, b, caseSensitive)
		if e != nil {
			err = e
		}
		if reverse {
			return -c
		}
		return c
	})
	if err != nil {
		return exec.AsValue(fmt.Errorf("dictsort: %w", err))
	}
	out := make([]any, len(pairs))
	for i, p := range pairs {
		out[i] = []any{p.Key.Interface(), p.Value.Interface()}
	}
	return exec.AsValue(out)
}

// pyCompare orders two values as Python's < does for the types it can
// compare (numbers with numbers, strings with strings; strings folded to
// lower case unless caseSensitive, as jinja2's sort filters do).
func pyCompare(a, b *exec.Value, caseSensitive bool) (int, error) {
	switch {
	case a.IsString() && b.IsString():
		x, y := a.String(), b.String()
		if !caseSensitive {
			x, y = pyLower(x), pyLower(y)
		}
		return strings.Compare(x, y), nil
	case a.IsNumber() && b.IsNumber() || a.IsBool() && b.IsBool():
		x, y := numberOf(a), numberOf(b)
		switch {
		case x < y:
			return -1, nil
		case x > y:
			return 1, nil
		}
		return 0, nil
	}
	return 0, fmt.Errorf("'<' not supported between instances of '%s' and '%s'", pyTypeName(a), pyTypeName(b))
}

func numberOf(v *exec.Value) float64 {
	if v.IsBool() {
		if v.Bool() {
			return 1
		}
		return 0
	}
	return v.Float()
}

func filterCapitalize(_ *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	return exec.AsValue(pyCapitalize(in.String()))
}

// testTrue and testFalse are jinja2's: `x is true` only for the boolean
// True (gonja's calls every non-bool false).
func testTrue(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
	return in.IsBool() && in.Bool(), nil
}

func testFalse(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
	return in.IsBool() && !in.Bool(), nil
}

// testSequence is jinja2's: strings, lists and mappings are sequences.
func testSequence(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
	return in.IsString() || in.IsList() || in.IsDict(), nil
}

// strMethods are Python's str methods where gonja's differ (strip and
// split with no argument work on any whitespace, as Python's do), with the
// rest of gonja's.
func strMethods() *exec.MethodSet[string] {
	type method = exec.Method[string]
	m := map[string]method{
		"strip": func(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
			chars, _ := argument(va, 0, "chars")
			return pyStrip(s, chars, true, true), nil
		},
		"lstrip": func(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
			chars, _ := argument(va, 0, "chars")
			return pyStrip(s, chars, true, false), nil
		},
		"rstrip": func(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
			chars, _ := argument(va, 0, "chars")
			return pyStrip(s, chars, false, true), nil
		},
		"split": func(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
			return pySplit(s, va, false)
		},
		"rsplit": func(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
			return pySplit(s, va, true)
		},
		"startswith": func(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
			return affix(s, va, strings.HasPrefix)
		},
		"endswith": func(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
			return affix(s, va, strings.HasSuffix)
		},
		"replace": func(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
			old, ok1 := argument(va, 0, "old")
			repl, ok2 := argument(va, 1, "new")
			if !ok1 || !ok2 || !old.IsString() || !repl.IsString() {
				return nil, fmt.Errorf("replace expects two strings")
			}
			n := -1
			if c, ok := argument(va, 2, "count"); ok {
				n = c.Integer()
			}
			if n < 0 {
				n = -1
			}
			return strings.Replace(s, old.String(), repl.String(), n), nil
		},
		"upper": func(s string, _ *exec.Value, _ *exec.VarArgs) (any, error) { return pyUpper(s), nil },
		"lower": func(s string, _ *exec.Value, _ *exec.VarArgs) (any, error) { return pyLower(s), nil },
		"count": func(s string, _ *exec.Value, va *exec.VarArgs) (any, error) {
			sub, ok := argument(va, 0, "sub")
			if !ok || !sub.IsString() {
				return nil, fmt.Errorf("count expects a string")
			}
			if sub.String() == "" {
				return utf8.RuneCountInString(s) + 1, nil
			}
			return strings.Count(s, sub.String()), nil
		},
		"title": func(s string, _ *exec.Value, _ *exec.VarArgs) (any, error) { return pyTitle(s), nil },
		"capitalize": func(s string, _ *exec.Value, _ *exec.VarArgs) (any, error) {
			return pyCapitalize(s), nil
		},
	}
	for _, name := range []string{"casefold", "center", "encode", "expandtabs", "find", "format",
		"format_map", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "islower", "isnumeric",
		"isprintable", "isspace", "istitle", "isupper", "join", "ljust", "partition", "removeprefix",
		"removesuffix", "rfind", "rjust", "rpartition", "splitlines", "swapcase", "zfill"} {
		if fn, ok := builtins.Methods.Str.Get(name); ok {
			m[name] = fn
		}
	}
	return exec.NewMethodSet(m)
}

// pySplit is str.split / str.rsplit: with no separator (or None) on runs
// of whitespace, dropping empty ends; otherwise on each separator.
func pySplit(s string, va *exec.VarArgs, fromRight bool) (any, error) {
	sepV, _ := argument(va, 0, "sep")
	maxsplit := -1
	if v, ok := argument(va, 1, "maxsplit"); ok {
		maxsplit = v.Integer()
	}
	var parts []string
	if sepV == nil || sepV.IsNil() {
		parts = splitWhitespace(s, maxsplit, fromRight)
	} else {
		sep := sepV.String()
		if sep == "" {
			return nil, fmt.Errorf("empty separator")
		}
		switch {
		case maxsplit < 0:
			parts = strings.Split(s, sep)
		case !fromRight:
			parts = strings.SplitN(s, sep, maxsplit+1)
		default:
			parts = []string{}
			rest := s
			for range maxsplit {
				i := strings.LastIndex(rest, sep)
				if i < 0 {
					break
				}
				parts = append([]string{rest[i+len(sep):]}, parts...)
				rest = rest[:i]
			}
			parts = append([]string{rest}, parts...)
		}
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

func splitWhitespace(s string, maxsplit int, fromRight bool) []string {
	if maxsplit < 0 {
		return strings.FieldsFunc(s, pyWhitespace)
	}
	parts := []string{}
	if !fromRight {
		rest := strings.TrimLeftFunc(s, pyWhitespace)
		for len(parts) < maxsplit && rest != "" {
			i := strings.IndexFunc(rest, pyWhitespace)
			if i < 0 {
				break
			}
			parts = append(parts, rest[:i])
			rest = strings.TrimLeftFunc(rest[i:], pyWhitespace)
		}
		if rest != "" {
			parts = append(parts, rest)
		}
		return parts
	}
	rest := strings.TrimRightFunc(s, pyWhitespace)
	for len(parts) < maxsplit && rest != "" {
		i := strings.LastIndexFunc(rest, pyWhitespace)
		if i < 0 {
			break
		}
		_, size := firstRune(rest[i:])
		parts = append([]string{rest[i+size:]}, parts...)
		rest = strings.TrimRightFunc(rest[:i], pyWhitespace)
	}
	if rest != "" {
		parts = append([]string{rest}, parts...)
	}
	return parts
}

func firstRune(s string) (rune, int) {
	for _, r := range s {
		return r, len(string(r))
	}
	return 0, 0
}

// affix is startswith/endswith: the argument is a string or a tuple of
// strings.
func affix(s string, va *exec.VarArgs, has func(s, fix string) bool) (any, error) {
	v, ok := argument(va, 0, "prefix")
	if !ok {
		return nil, fmt.Errorf("startswith/endswith takes at least 1 argument")
	}
	if v.IsList() {
		for i := range v.Len() {
			if has(s, listItem(v, i).String()) {
				return true, nil
			}
		}
		return false, nil
	}
	if !v.IsString() {
		return nil, fmt.Errorf("startswith/endswith first arg must be str or a tuple of str, not %s", pyTypeName(v))
	}
	return has(s, v.String()), nil
}

// dictMethods are Python's dict methods that read, in the mapping's order.
// (transformers' sandbox is immutable: update, pop and the like raise
// there, so they are absent here too.)
func dictMethods() *exec.MethodSet[map[string]any] {
	type method = exec.Method[map[string]any]
	return exec.NewMethodSet(map[string]method{
		"items": func(_ map[string]any, self *exec.Value, _ *exec.VarArgs) (any, error) {
			return pairList(self), nil
		},
		"keys": func(_ map[string]any, self *exec.Value, _ *exec.VarArgs) (any, error) {
			pairs := dictPairs(self)
			out := make([]any, len(pairs))
			for i, p := range pairs {
				out[i] = p.Key.Interface()
			}
			return out, nil
		},
		"values": func(_ map[string]any, self *exec.Value, _ *exec.VarArgs) (any, error) {
			pairs := dictPairs(self)
			out := make([]any, len(pairs))
			for i, p := range pairs {
				out[i] = p.Value.Interface()
			}
			return out, nil
		},
		"get": func(_ map[string]any, self *exec.Value, va *exec.VarArgs) (any, error) {
			if len(va.Args) < 1 || len(va.Args) > 2 {
				return nil, fmt.Errorf("get expected 1 or 2 arguments, got %d", len(va.Args))
			}
			for _, p := range dictPairs(self) {
				if p.Key.EqualValueTo(va.Args[0]) {
					return p.Value.Interface(), nil
				}
			}
			if len(va.Args) == 2 {
				return va.Args[1].Interface(), nil
			}
			return nil, nil
		},
	})
}
