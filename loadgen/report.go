package loadgen

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Level is one load level's outcome, for the report.
type Level struct {
	Label    string // e.g. "concurrency 16"
	Level    float64
	Summary  Summary
	Requests []Result
}

// WriteHTML writes a self-contained HTML report (inline SVG charts, no
// script, nothing fetched): for each run the latency distributions (CDF)
// and throughput and latency over time, and across a sweep latency and
// throughput against load.
//
// info lists what the report is of (workload, model, server, date...), as
// label and value rows under the title.
func WriteHTML(w io.Writer, title string, info [][2]string, runs []Level) error {
	var b strings.Builder
	b.WriteString(`<!doctype html><html><head><meta charset="utf-8"><title>` + html.EscapeString(title) + `</title><style>
body{font-family:sans-serif;margin:24px;color:#222} h1{font-size:20px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
.charts{display:flex;flex-wrap:wrap;gap:12px} svg{background:#fafafa;border:1px solid #ddd}
</style></head><body>`)
	fmt.Fprintf(&b, "<h1>%s</h1>\n", html.EscapeString(title))
	if len(info) > 0 {
		b.WriteString("<table>")
		for _, kv := range info {
			fmt.Fprintf(&b, `<tr><th style="text-align:left">%s</th><td style="text-align:left">%s</td></tr>`, html.EscapeString(kv[0]), html.EscapeString(kv[1]))
		}
		b.WriteString("</table>\n")
	}
	if len(runs) > 1 {
		b.WriteString("<h2>Against load</h2><div class=charts>")
		var ttft50, ttft99, itl50, itl99, tput [][2]float64
		for _, r := range runs {
			s := r.Summary
			ttft50 = append(ttft50, [2]float64{r.Level, s.TTFT.P50})
			ttft99 = append(ttft99, [2]float64{r.Level, s.TTFT.P99})
			itl50 = append(itl50, [2]float64{r.Level, s.ITL.P50})
			itl99 = append(itl99, [2]float64{r.Level, s.ITL.P99})
			tput = append(tput, [2]float64{r.Level, s.OutputTokensPerS})
		}
		// Loads usually double: a log axis when they span 4× or more.
		o := chartOptions{markers: true, logX: runs[0].Level > 0 && runs[len(runs)-1].Level >= 4*runs[0].Level}
		b.WriteString(chart("TTFT against load", "load", "ms", []series{{"p50", ttft50}, {"p99", ttft99}}, o))
		b.WriteString(chart("ITL against load", "load", "ms", []series{{"p50", itl50}, {"p99", itl99}}, o))
		b.WriteString(chart("Throughput against load", "load", "output tokens/s", []series{{"output tokens/s", tput}}, o))
		b.WriteString("</div>")
	}
	for _, r := range runs {
		s := r.Summary
		fmt.Fprintf(&b, "<h2>%s</h2>\n<p>%d requests in %.2f s; %.2f requests/s, %.1f output tokens/s, goodput %.2f requests/s, error rate %.2f%%</p>\n",
			html.EscapeString(r.Label), s.Requests, s.Seconds, s.RequestsPerS, s.OutputTokensPerS, s.GoodputPerS, 100*s.ErrorRate)
		b.WriteString("<table><tr><th>ms</th><th>mean</th><th>p50</th><th>p90</th><th>p95</th><th>p99</th><th>max</th></tr>")
		for _, row := range []struct {
			name string
			st   Stats
		}{{"TTFT", s.TTFT}, {"ITL", s.ITL}, {"TPOT", s.TPOT}, {"E2E", s.E2E}} {
			fmt.Fprintf(&b, "<tr><th>%s</th><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td></tr>",
				row.name, row.st.Mean, row.st.P50, row.st.P90, row.st.P95, row.st.P99, row.st.Max)
		}
		b.WriteString("</table><div class=charts>")
		ok := measured(r.Requests)
		var ttft, itl, e2e []time.Duration
		for _, q := range ok {
			ttft, e2e = append(ttft, q.TTFT), append(e2e, q.E2E)
			itl = append(itl, q.ITL...)
		}
		// A log axis: TTFT and ITL are not squashed against zero by E2E.
		b.WriteString(chart("Latency distribution (CDF)", "ms", "fraction of requests (ITL: of gaps)",
			[]series{{"TTFT", cdf(ttft)}, {"ITL", cdf(itl)}, {"E2E", cdf(e2e)}}, chartOptions{logX: true}))
		tokens, latency := overTime(ok)
		b.WriteString(chart("Output tokens per second over time", "s", "tokens/s", []series{{"output tokens/s", tokens}}, chartOptions{}))
		b.WriteString(chart("TTFT over time", "s (request start)", "ms", []series{{"TTFT", latency}}, chartOptions{}))
		b.WriteString("</div>")
	}
	b.WriteString("</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

type series struct {
	name   string
	points [][2]float64
}

// cdf is the empirical distribution of ds in ms: (value, fraction ≤ value),
// thinned to at most 400 points.
func cdf(ds []time.Duration) [][2]float64 {
	ms := make([]float64, len(ds))
	for i, d := range ds {
		ms[i] = float64(d) / 1e6
	}
	slices.Sort(ms)
	var pts [][2]float64
	step := max(1, len(ms)/400)
	for i := 0; i < len(ms); i += step {
		pts = append(pts, [2]float64{ms[i], float64(i+1) / float64(len(ms))})
	}
	if n := len(ms); n > 0 && pts[len(pts)-1][1] != 1 {
		pts = append(pts, [2]float64{ms[n-1], 1})
	}
	return pts
}

// overTime buckets requests by the second: the output tokens of requests
// ending in it (spread evenly over their lifetime) and the mean TTFT of
// those starting in it.
func overTime(rs []Result) (tokens, ttft [][2]float64) {
	if len(rs) == 0 {
		return nil, nil
	}
	t0 := rs[0].Start
	for _, r := range rs {
		if r.Start.Before(t0) {
			t0 = r.Start
		}
	}
	tok := map[int]float64{}
	sum, n := map[int]float64{}, map[int]int{}
	last := 0
	for _, r := range rs {
		s := r.Start.Sub(t0).Seconds()
		e := s + r.E2E.Seconds()
		last = max(last, int(e))
		// Spread the request's tokens over the seconds it ran.
		for sec := int(s); sec <= int(e); sec++ {
			lo, hi := math.Max(s, float64(sec)), math.Min(e, float64(sec+1))
			if hi > lo && e > s {
				tok[sec] += float64(r.OutputTokens) * (hi - lo) / (e - s)
			}
		}
		sum[int(s)] += float64(r.TTFT) / 1e6
		n[int(s)]++
	}
	for sec := 0; sec <= last; sec++ {
		tokens = append(tokens, [2]float64{float64(sec) + 0.5, tok[sec]})
		if n[sec] > 0 {
			ttft = append(ttft, [2]float64{float64(sec) + 0.5, sum[sec] / float64(n[sec])})
		}
	}
	return tokens, ttft
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"}

// axis maps values to one axis of a chart: linear between round ends, or
// logarithmic (log) between powers of ten; ticks are round values.
type axis struct {
	lo, hi float64
	log    bool
}

// newAxis fits an axis to [lo, hi] (log: positive values only).
func newAxis(lo, hi float64, log bool) axis {
	if log {
		lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
		if hi <= lo {
			hi = lo * 10
		}
		return axis{lo, hi, true}
	}
	if hi <= lo {
		hi = lo + 1
	}
	step := niceStep((hi - lo) / 4)
	return axis{math.Floor(lo/step) * step, math.Ceil(hi/step) * step, false}
}

// niceStep is the round step (1, 2 or 5 times a power of ten) nearest raw
// (in ratio).
func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	best := p
	for _, m := range []float64{2, 5, 10} {
		if math.Abs(math.Log(m*p/raw)) < math.Abs(math.Log(best/raw)) {
			best = m * p
		}
	}
	return best
}

// frac is v's position along the axis, 0 to 1.
func (a axis) frac(v float64) float64 {
	if a.log {
		return (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	}
	return (v - a.lo) / (a.hi - a.lo)
}

// ticks are the axis's round values: every step between the ends, or each
// power of ten (with 2 and 5 times it when the axis spans two decades or
// less).
func (a axis) ticks() []float64 {
	const most = 64 // ticks, whatever the ends
	var ts []float64
	if a.log {
		decades := math.Log10(a.hi) - math.Log10(a.lo)
		for p := a.lo; p <= a.hi*1.0001 && len(ts) < most; p *= 10 {
			ts = append(ts, p)
			if decades <= 2 && p*2 < a.hi {
				ts = append(ts, p*2, p*5)
			}
		}
		return ts
	}
	step := niceStep((a.hi - a.lo) / 4)
	for v := a.lo; v <= a.hi+step/1e6 && len(ts) < most; v += step {
		ts = append(ts, v)
	}
	return ts
}

// chartOptions: a logarithmic x axis, and markers on the points (few
// points: a sweep's levels).
type chartOptions struct{ logX, markers bool }

// chart draws line series in a 460×320 SVG: axes with round ticks, the
// legend above the plot (off the lines).
func chart(title, xlabel, ylabel string, ss []series, o chartOptions) string {
	const W, H, L, R, T, B = 460.0, 320.0, 60.0, 15.0, 52.0, 45.0
	// A point is drawn when it is finite (a sweep's unbounded rate is
	// not) and, on a log axis, positive.
	drawn := func(p [2]float64) bool {
		return !math.IsNaN(p[0]) && !math.IsNaN(p[1]) && !math.IsInf(p[0], 0) && !math.IsInf(p[1], 0) && (!o.logX || p[0] > 0)
	}
	minX, maxX, maxY := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range ss {
		for _, p := range s.points {
			if !drawn(p) {
				continue
			}
			minX, maxX, maxY = math.Min(minX, p[0]), math.Max(maxX, p[0]), math.Max(maxY, p[1])
		}
	}
	if math.IsInf(minX, 0) {
		minX, maxX = 1, 10
	}
	if !o.logX {
		minX = math.Min(minX, 0)
	}
	if maxY == 0 {
		maxY = 1
	}
	xa, ya := newAxis(minX, maxX, o.logX), newAxis(0, maxY, false)
	x := func(v float64) float64 { return L + xa.frac(v)*(W-L-R) }
	y := func(v float64) float64 { return H - B - ya.frac(v)*(H-T-B) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" role="img" aria-label="%s">`, W, H, W, H, html.EscapeString(title))
	fmt.Fprintf(&b, `<text x="%g" y="18" font-size="13" font-weight="bold">%s</text>`, L, html.EscapeString(title))
	// The legend: a row between the title and the plot.
	lx := L
	for i, s := range ss {
		color := palette[i%len(palette)]
		fmt.Fprintf(&b, `<rect x="%g" y="28" width="10" height="10" fill="%s"/><text x="%g" y="37" font-size="11">%s</text>`,
			lx, color, lx+14, html.EscapeString(s.name))
		lx += 24 + 6.5*float64(len(s.name))
	}
	fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#444"/><line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#444"/>`,
		L, H-B, W-R, H-B, L, T, L, H-B)
	for _, xv := range xa.ticks() {
		fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="10" text-anchor="middle">%s</text>`, x(xv), H-B+14, num(xv))
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#444"/>`, x(xv), H-B, x(xv), H-B+4)
	}
	for _, yv := range ya.ticks() {
		fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="10" text-anchor="end">%s</text>`, L-4, y(yv)+3, num(yv))
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#e4e4e4"/>`, L, y(yv), W-R, y(yv))
	}
	if o.logX {
		xlabel += " (log scale)"
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="11" text-anchor="middle">%s</text>`, (L+W-R)/2, H-8, html.EscapeString(xlabel))
	fmt.Fprintf(&b, `<text x="12" y="%g" font-size="11" text-anchor="middle" transform="rotate(-90 12 %g)">%s</text>`, (T+H-B)/2, (T+H-B)/2, html.EscapeString(ylabel))
	for i, s := range ss {
		color := palette[i%len(palette)]
		var pts []string
		for _, p := range s.points {
			if drawn(p) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p[0]), y(p[1])))
				if o.markers {
					fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`, x(p[0]), y(p[1]), color)
				}
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, color, strings.Join(pts, " "))
	}
	b.WriteString("</svg>")
	return b.String()
}

func num(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
