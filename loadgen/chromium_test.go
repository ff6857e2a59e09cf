package loadgen

import (
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHTMLReportInChromium renders a report in headless Chromium (Debian's
// chromium package; the test skips without it) and checks that the
// screenshot shows the charts: pixels of each series color.
func TestHTMLReportInChromium(t *testing.T) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install chromium)")
	}
	start := time.Now()
	var rs []Result
	for i := 0; i < 80; i++ {
		rs = append(rs, Result{Start: start.Add(time.Duration(i) * 40 * time.Millisecond), TTFT: time.Duration(20+i%13) * time.Millisecond,
			E2E: time.Duration(300+i%17) * time.Millisecond, ITL: []time.Duration{5 * time.Millisecond, time.Duration(6+i%5) * time.Millisecond}, OutputTokens: 3})
	}
	s := Summarize(rs, SLO{}, Cost{})
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	f, err := os.Create(page)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteHTML(f, "chromium check", [][2]string{{"workload", "test"}}, []Level{{Label: "rate 1", Level: 1, Summary: s, Requests: rs}, {Label: "rate 2", Level: 2, Summary: s, Requests: rs}}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	shot := filepath.Join(dir, "shot.png")
	cmd := exec.Command(bin, "--headless", "--no-sandbox", "--disable-gpu", "--screenshot="+shot, "--window-size=1400,2400", "file://"+page)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, out)
	}
	r, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	img, err := png.Decode(r)
	if err != nil {
		t.Fatal(err)
	}
	// The first three series colors, as RGB.
	type rgb struct{ r, g, b uint32 }
	colors := map[string]rgb{}
	for _, hex := range palette[:3] {
		var c [3]uint32
		for i := range c {
			for _, d := range hex[1+2*i : 3+2*i] {
				c[i] = c[i]*16 + uint32(strings.IndexRune("0123456789abcdef", d))
			}
		}
		colors[hex] = rgb{c[0], c[1], c[2]}
	}
	counts := map[string]int{}
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			for hex, c := range colors {
				if near(cr>>8, c.r) && near(cg>>8, c.g) && near(cb>>8, c.b) {
					counts[hex]++
				}
			}
		}
	}
	for _, hex := range palette[:3] {
		if counts[hex] < 200 {
			t.Errorf("color %s: %d pixels in the screenshot, want the chart lines (at least 200)", hex, counts[hex])
		}
	}
	t.Logf("series pixels in a %v screenshot: %v", bounds.Size(), counts)
}

func near(a, b uint32) bool { return a+12 >= b && b+12 >= a }
