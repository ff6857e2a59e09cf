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
func WriteHTML(w io.Writer, title string, runs []Level) error {
	var b strings.Builder
	b.WriteString(`<!doctype html><html><head><meta charset="utf-8"><title>` + html.EscapeString(title) + `</title><style>
body{font-family:sans-serif;margin:24px;color:#222} h1{font-size:20px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
.charts{display:flex;flex-wrap:wrap;gap:12px} svg{background:#fafafa;border:1px solid #ddd}
</style></head><body>`)
	fmt.Fprintf(&b, "<h1>%s</h1>\n", html.EscapeString(title))
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
		b.WriteString(chart("TTFT against load", "load", "ms", []series{{"p50", ttft50}, {"p99", ttft99}}))
		b.WriteString(chart("ITL against load", "load", "ms", []series{{"p50", itl50}, {"p99", itl99}}))
		b.WriteString(chart("Throughput against load", "load", "output tokens/s", []series{{"output tokens/s", tput}}))
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
		b.WriteString(chart("Latency distribution (CDF)", "ms", "fraction of requests (ITL: of gaps)",
			[]series{{"TTFT", cdf(ttft)}, {"ITL", cdf(itl)}, {"E2E", cdf(e2e)}}))
		tokens, latency := overTime(ok)
		b.WriteString(chart("Output tokens per second over time", "s", "tokens/s", []series{{"output tokens/s", tokens}}))
		b.WriteString(chart("TTFT over time", "s (request start)", "ms", []series{{"TTFT", latency}}))
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

// chart draws line series in a 460×300 SVG with axes, ticks and a legend.
func chart(title, xlabel, ylabel string, ss []series) string {
	const W, H, L, R, T, B = 460.0, 300.0, 60.0, 15.0, 30.0, 45.0
	minX, maxX, maxY := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range ss {
		for _, p := range s.points {
			if math.IsNaN(p[0]) || math.IsNaN(p[1]) {
				continue
			}
			minX, maxX, maxY = math.Min(minX, p[0]), math.Max(maxX, p[0]), math.Max(maxY, p[1])
		}
	}
	if math.IsInf(minX, 0) {
		minX, maxX = 0, 1
	}
	if maxX == minX {
		maxX = minX + 1
	}
	if maxY == 0 {
		maxY = 1
	}
	minX = math.Min(minX, 0)
	x := func(v float64) float64 { return L + (v-minX)/(maxX-minX)*(W-L-R) }
	y := func(v float64) float64 { return H - B - v/maxY*(H-T-B) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" role="img" aria-label="%s">`, W, H, W, H, html.EscapeString(title))
	fmt.Fprintf(&b, `<text x="%g" y="18" font-size="13" font-weight="bold">%s</text>`, L, html.EscapeString(title))
	fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#444"/><line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#444"/>`,
		L, H-B, W-R, H-B, L, T, L, H-B)
	for i := 0; i <= 4; i++ {
		xv, yv := minX+(maxX-minX)*float64(i)/4, maxY*float64(i)/4
		fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="10" text-anchor="middle">%s</text>`, x(xv), H-B+14, num(xv))
		fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="10" text-anchor="end">%s</text>`, L-4, y(yv)+3, num(yv))
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#e4e4e4"/>`, L, y(yv), W-R, y(yv))
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" font-size="11" text-anchor="middle">%s</text>`, (L+W-R)/2, H-8, html.EscapeString(xlabel))
	fmt.Fprintf(&b, `<text x="12" y="%g" font-size="11" text-anchor="middle" transform="rotate(-90 12 %g)">%s</text>`, (T+H-B)/2, (T+H-B)/2, html.EscapeString(ylabel))
	for i, s := range ss {
		color := palette[i%len(palette)]
		var pts []string
		for _, p := range s.points {
			if !math.IsNaN(p[0]) && !math.IsNaN(p[1]) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p[0]), y(p[1])))
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, color, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<rect x="%g" y="%g" width="10" height="10" fill="%s"/><text x="%g" y="%g" font-size="11">%s</text>`,
			W-R-110, T+4+float64(i)*14, color, W-R-96, T+13+float64(i)*14, html.EscapeString(s.name))
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
