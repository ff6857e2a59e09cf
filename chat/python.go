package chat

// Python's text forms of values, which templates show through tojson
// (json.dumps), the string filter (str) and strftime_now (strftime).

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// jsonOptions are the json.dumps arguments transformers' tojson passes on.
type jsonOptions struct {
	ensureASCII bool
	indent      *string // nil: one line
	itemSep     string
	keySep      string
	sortKeys    bool
}

// pyJSON writes v as json.dumps(v, ...) does.
func pyJSON(v *exec.Value, o jsonOptions) (string, error) {
	var b strings.Builder
	if err := writeJSON(&b, v, o, 0, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

// maxDepth bounds nesting, as Python's recursion limit does, so that a
// self-referencing value is an error rather than a stack overflow.
const maxDepth = 500

func writeJSON(b *strings.Builder, v *exec.Value, o jsonOptions, level, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("tojson: nesting deeper than %d", maxDepth)
	}
	switch {
	case v == nil || v.IsNil():
		b.WriteString("null")
	case v.IsError():
		return fmt.Errorf("tojson: %s", v.Error())
	case v.IsBool():
		b.WriteString(strconv.FormatBool(v.Bool()))
	case v.IsInteger():
		b.WriteString(strconv.Itoa(v.Integer()))
	case v.IsFloat():
		f := v.Float()
		switch {
		case math.IsNaN(f):
			b.WriteString("NaN")
		case math.IsInf(f, 1):
			b.WriteString("Infinity")
		case math.IsInf(f, -1):
			b.WriteString("-Infinity")
		default:
			b.WriteString(pyFloat(f))
		}
	case v.IsString():
		writeJSONString(b, v.String(), o.ensureASCII)
	case v.IsList():
		n := v.Len()
		if n == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i := range n {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			newline(b, o, level+1)
			if err := writeJSON(b, listItem(v, i), o, level+1, depth+1); err != nil {
				return err
			}
		}
		newline(b, o, level)
		b.WriteByte(']')
	case v.IsDict():
		pairs := dictPairs(v)
		if len(pairs) == 0 {
			b.WriteString("{}")
			return nil
		}
		if o.sortKeys {
			slices.SortStableFunc(pairs, func(x, y *exec.Pair) int { return strings.Compare(x.Key.String(), y.Key.String()) })
		}
		b.WriteByte('{')
		for i, p := range pairs {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			newline(b, o, level+1)
			// json.dumps turns keys that are numbers, bools or None into strings.
			switch k := p.Key; {
			case k.IsString():
				writeJSONString(b, k.String(), o.ensureASCII)
			case k.IsNil():
				b.WriteString(`"null"`)
			case k.IsBool():
				b.WriteString(`"` + strconv.FormatBool(k.Bool()) + `"`)
			case k.IsInteger():
				b.WriteString(`"` + strconv.Itoa(k.Integer()) + `"`)
			case k.IsFloat():
				b.WriteString(`"` + pyFloat(k.Float()) + `"`)
			default:
				return fmt.Errorf("tojson: keys must be str, int, float, bool or None, not %s", pyTypeName(k))
			}
			b.WriteString(o.keySep)
			if err := writeJSON(b, p.Value, o, level+1, depth+1); err != nil {
				return err
			}
		}
		newline(b, o, level)
		b.WriteByte('}')
	default:
		return fmt.Errorf("tojson: object of type %s is not JSON serializable", pyTypeName(v))
	}
	return nil
}

func newline(b *strings.Builder, o jsonOptions, level int) {
	if o.indent == nil {
		return
	}
	b.WriteByte('\n')
	for range level {
		b.WriteString(*o.indent)
	}
}

// writeJSONString quotes s as json.dumps does: ensure_ascii=False leaves
// every character but the quote, the backslash and controls below U+0020 as
// it is; ensure_ascii=True also escapes everything outside printable ASCII,
// as \uXXXX (surrogate pairs above U+FFFF).
func writeJSONString(b *strings.Builder, s string, ensureASCII bool) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || (ensureASCII && r == 0x7f):
				fmt.Fprintf(b, `\u%04x`, r)
			case ensureASCII && r > 0x7f:
				if r > 0xffff {
					r -= 0x10000
					fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
				} else {
					fmt.Fprintf(b, `\u%04x`, r)
				}
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// pyFloat is Python's repr of a finite float: the shortest digits that read
// back the same, in positional notation when the decimal exponent is in
// [-5, 16), with at least one digit after the point.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	if f == 0 {
		if math.Signbit(f) {
			return "-0.0"
		}
		return "0.0"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // shortest digits, as Python's repr
	exp, _ := strconv.Atoi(e[strings.LastIndexByte(e, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return e
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// pyStr is Python's str(v), which the string filter returns: strings as
// they are, everything else as repr.
func pyStr(v *exec.Value) (string, error) {
	if v != nil && v.IsString() {
		return v.String(), nil
	}
	var b strings.Builder
	if err := writeRepr(&b, v, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

// writeRepr writes Python's repr(v): {'key': 'value', 'n': 1, 'ok': True,
// 'x': None, 'list': [1.5]}.
func writeRepr(b *strings.Builder, v *exec.Value, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("string: nesting deeper than %d", maxDepth)
	}
	switch {
	case v == nil || v.IsNil():
		b.WriteString("None")
	case v.IsError():
		return fmt.Errorf("string: %s", v.Error())
	case v.IsBool():
		if v.Bool() {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case v.IsInteger():
		b.WriteString(strconv.Itoa(v.Integer()))
	case v.IsFloat():
		b.WriteString(pyFloat(v.Float()))
	case v.IsString():
		writeStrRepr(b, v.String())
	case v.IsList():
		b.WriteByte('[')
		for i := range v.Len() {
			if i > 0 {
				b.WriteString(", ")
			}
			if err := writeRepr(b, listItem(v, i), depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case v.IsDict():
		b.WriteByte('{')
		for i, p := range dictPairs(v) {
			if i > 0 {
				b.WriteString(", ")
			}
			if err := writeRepr(b, p.Key, depth+1); err != nil {
				return err
			}
			b.WriteString(": ")
			if err := writeRepr(b, p.Value, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		b.WriteString(v.String())
	}
	return nil
}

// writeStrRepr quotes s as Python's repr: single quotes unless s holds a
// single quote and no double quote; backslash escapes for the quote, the
// backslash, \t \n \r, and \x.. \u.... \U........ for characters Python
// does not print (controls, separators, unassigned and private-use code
// points); every other character as it is.
func writeStrRepr(b *strings.Builder, s string) {
	quote := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		quote = '"'
	}
	b.WriteByte(quote)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			// Not UTF-8: Python would hold a surrogate escape here.
			fmt.Fprintf(b, `\udc%02x`, s[i])
			i++
			continue
		}
		i += size
		switch {
		case r == rune(quote) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(b, `\x%02x`, r)
		case r < 0x7f || unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xff:
			fmt.Fprintf(b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			fmt.Fprintf(b, `\U%08x`, r)
		}
	}
	b.WriteByte(quote)
}

func pyTypeName(v *exec.Value) string {
	switch {
	case v.IsNil():
		return "NoneType"
	case v.IsBool():
		return "bool"
	case v.IsInteger():
		return "int"
	case v.IsFloat():
		return "float"
	case v.IsString():
		return "str"
	case v.IsList():
		return "list"
	case v.IsDict():
		return "dict"
	case v.IsCallable():
		return "function"
	}
	return v.Val.Type().String()
}

// listItem is the i-th element of a list value, whatever Go slice type
// holds it.
func listItem(v *exec.Value, i int) *exec.Value {
	rv := v.Val
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		rv = rv.Elem()
	}
	return exec.ToValue(rv.Index(i))
}

// dictPairs returns a mapping's pairs: an exec.Dict's in its order, a Go
// map's sorted by key (Go maps have no order to keep).
func dictPairs(v *exec.Value) []*exec.Pair {
	rv := v.Val
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		rv = rv.Elem()
	}
	if rv.Type() == exec.TypeDict {
		d := rv.Interface().(exec.Dict)
		return slices.Clone(d.Pairs)
	}
	var pairs []*exec.Pair
	for _, k := range v.Keys() { // sorted
		item, _ := v.GetItem(k.Interface())
		pairs = append(pairs, &exec.Pair{Key: k, Value: item})
	}
	return pairs
}

var (
	shortDays   = []string{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"}
	longDays    = []string{"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"}
	shortMonths = []string{"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"}
	longMonths  = []string{"January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"}
)

// strftime formats t as Python's datetime.strftime does for a naive local
// time in the C locale (what transformers' strftime_now calls): %z and %Z
// are empty, glibc's %-d style (no padding) is understood, and an unknown
// directive is written as it stands.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		pad := true
		if format[i] == '-' && i+1 < len(format) {
			pad = false
			i++
		}
		num := func(n, width int) {
			s := strconv.Itoa(n)
			if pad {
				for len(s) < width {
					s = "0" + s
				}
			}
			b.WriteString(s)
		}
		hour12 := t.Hour() % 12
		if hour12 == 0 {
			hour12 = 12
		}
		switch format[i] {
		case 'a':
			b.WriteString(shortDays[t.Weekday()])
		case 'A':
			b.WriteString(longDays[t.Weekday()])
		case 'b', 'h':
			b.WriteString(shortMonths[t.Month()-1])
		case 'B':
			b.WriteString(longMonths[t.Month()-1])
		case 'c':
			fmt.Fprintf(&b, "%s %s %2d %02d:%02d:%02d %d", shortDays[t.Weekday()], shortMonths[t.Month()-1], t.Day(), t.Hour(), t.Minute(), t.Second(), t.Year())
		case 'C':
			num(t.Year()/100, 2)
		case 'd':
			num(t.Day(), 2)
		case 'D':
			fmt.Fprintf(&b, "%02d/%02d/%02d", int(t.Month()), t.Day(), t.Year()%100)
		case 'e':
			if pad {
				fmt.Fprintf(&b, "%2d", t.Day())
			} else {
				num(t.Day(), 1)
			}
		case 'f':
			fmt.Fprintf(&b, "%06d", t.Nanosecond()/1000)
		case 'F':
			fmt.Fprintf(&b, "%04d-%02d-%02d", t.Year(), int(t.Month()), t.Day())
		case 'G':
			y, _ := t.ISOWeek()
			num(y, 4)
		case 'H':
			num(t.Hour(), 2)
		case 'I':
			num(hour12, 2)
		case 'j':
			num(t.YearDay(), 3)
		case 'k':
			fmt.Fprintf(&b, "%2d", t.Hour())
		case 'l':
			fmt.Fprintf(&b, "%2d", hour12)
		case 'm':
			num(int(t.Month()), 2)
		case 'M':
			num(t.Minute(), 2)
		case 'n':
			b.WriteByte('\n')
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'R':
			fmt.Fprintf(&b, "%02d:%02d", t.Hour(), t.Minute())
		case 'S':
			num(t.Second(), 2)
		case 't':
			b.WriteByte('\t')
		case 'T', 'X':
			fmt.Fprintf(&b, "%02d:%02d:%02d", t.Hour(), t.Minute(), t.Second())
		case 'u':
			wd := int(t.Weekday())
			if wd == 0 {
				wd = 7
			}
			num(wd, 1)
		case 'U':
			num((t.YearDay()+6-int(t.Weekday()))/7, 2)
		case 'V':
			_, w := t.ISOWeek()
			num(w, 2)
		case 'w':
			num(int(t.Weekday()), 1)
		case 'W':
			num((t.YearDay()+6-(int(t.Weekday())+6)%7)/7, 2)
		case 'x':
			fmt.Fprintf(&b, "%02d/%02d/%02d", int(t.Month()), t.Day(), t.Year()%100)
		case 'y':
			num(t.Year()%100, 2)
		case 'Y':
			num(t.Year(), 1)
		case 'z', 'Z':
			// A naive datetime has no zone.
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			if !pad {
				b.WriteByte('-')
			}
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
