// Command perfcharts draws docs/PERF.md's headline charts (SVG bar
// charts) from the figures in docs/charts/headline.json, each recorded in
// docs/PERF.md with its command, device and date:
//
//	go run ./tools/perfcharts docs/charts/headline.json docs/charts
package main

import (
	"encoding/json"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strings"
)

type chart struct {
	File, Title, Source, Unit string
	Kind                      string // "" (bars) or "line"
	Log                       bool
	Categories                []string
	X                         []float64 // a line chart's x values
	Series                    []struct {
		Name   string
		Values []float64
	}
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: perfcharts DATA.json OUTDIR")
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail(err)
	}
	var doc struct{ Charts []chart }
	if err := json.Unmarshal(raw, &doc); err != nil {
		fail(err)
	}
	for _, c := range doc.Charts {
		svg := draw(c)
		if c.Kind == "line" {
			svg = drawLines(c)
		}
		if err := os.WriteFile(filepath.Join(os.Args[2], c.File), []byte(svg), 0o644); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "perfcharts:", err)
	os.Exit(1)
}

var palette = []string{"#d62728", "#1f77b4", "#2ca02c", "#9467bd"}

// draw is a grouped bar chart: a group a category, a bar a series, each
// bar labelled with its value; a log scale when c.Log.
func draw(c chart) string {
	const W, H, L, R, T, B = 720.0, 360.0, 60.0, 20.0, 56.0, 60.0
	top := 0.0
	low := math.Inf(1)
	for _, s := range c.Series {
		for _, v := range s.Values {
			top, low = math.Max(top, v), math.Min(low, v)
		}
	}
	y := func(v float64) float64 { return H - B - v/top*(H-T-B) }
	if c.Log {
		lo, hi := math.Floor(math.Log10(low)), math.Ceil(math.Log10(top))
		y = func(v float64) float64 { return H - B - (math.Log10(v)-lo)/(hi-lo)*(H-T-B) }
	} else {
		top = math.Ceil(top/10) * 10
	}
	var b strings.Builder
	header(&b, c, W, H, L)
	fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#444"/>`, L, H-B, W-R, H-B)
	group := (W - L - R) / float64(len(c.Categories))
	bar := group * 0.8 / float64(len(c.Series))
	for ci, cat := range c.Categories {
		gx := L + float64(ci)*group + group*0.1
		fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="11" text-anchor="middle">%s</text>`, gx+group*0.4, H-B+16, html.EscapeString(cat))
		for si, s := range c.Series {
			v := s.Values[ci]
			x, yt := gx+float64(si)*bar, y(v)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x, yt, bar-2, H-B-yt, palette[si%len(palette)])
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">%s%s</text>`, x+bar/2, yt-3, label(v), c.Unit)
		}
	}
	scale := ""
	if c.Log {
		scale = " (bar heights on a log scale)"
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="10" fill="#555">%s%s</text>`, L, H-12, html.EscapeString("Source: "+c.Source), scale)
	b.WriteString("</svg>\n")
	return b.String()
}

func label(v float64) string {
	if v >= 1000 {
		s := fmt.Sprintf("%.0f", v)
		for i := len(s) - 3; i > 0; i -= 3 {
			s = s[:i] + "," + s[i:]
		}
		return s
	}
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// drawLines is a line chart of the series over c.X, the y axis from the
// lowest value's floor to the highest's ceiling.
func drawLines(c chart) string {
	const W, H, L, R, T, B = 720.0, 360.0, 60.0, 20.0, 56.0, 60.0
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for _, v := range s.Values {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	lo, hi = math.Floor(lo), math.Ceil(hi)
	x0, x1 := c.X[0], c.X[len(c.X)-1]
	x := func(v float64) float64 { return L + (v-x0)/(x1-x0)*(W-L-R) }
	y := func(v float64) float64 { return H - B - (v-lo)/(hi-lo)*(H-T-B) }
	var b strings.Builder
	header(&b, c, W, H, L)
	fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#444"/><line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#444"/>`, L, H-B, W-R, H-B, L, T, L, H-B)
	for v := lo; v <= hi; v++ {
		fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="10" text-anchor="end">%g</text><line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#e4e4e4"/>`, L-4, y(v)+3, v, L, y(v), W-R, y(v))
	}
	step := math.Pow(10, math.Floor(math.Log10(x1-x0)))
	if (x1-x0)/step < 4 {
		step /= 5
	}
	for v := math.Ceil(x0/step) * step; v <= x1; v += step {
		fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="10" text-anchor="middle">%g</text>`, x(v), H-B+14, v)
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="11" text-anchor="middle">step</text>`, (L+W-R)/2, H-B+30)
	for i, s := range c.Series {
		var pts []string
		for j, v := range s.Values {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(c.X[j]), y(v)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, palette[i%len(palette)], strings.Join(pts, " "))
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="10" fill="#555">%s</text>`, L, H-12, html.EscapeString("Source: "+c.Source))
	b.WriteString("</svg>\n")
	return b.String()
}

// header starts a chart's SVG: the canvas, the title and the legend row.
func header(b *strings.Builder, c chart, W, H, L float64) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif">`, W, H, W, H)
	fmt.Fprintf(b, `<rect width="%g" height="%g" fill="#fff"/><text x="%g" y="20" font-size="14" font-weight="bold">%s</text>`, W, H, L, html.EscapeString(c.Title))
	lx := L
	for i, s := range c.Series {
		fmt.Fprintf(b, `<rect x="%g" y="30" width="10" height="10" fill="%s"/><text x="%g" y="39" font-size="11">%s</text>`, lx, palette[i%len(palette)], lx+14, html.EscapeString(s.Name))
		lx += 30 + 6.5*float64(len(s.Name))
	}
}
