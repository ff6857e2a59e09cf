package cu

import (
	"bytes"
	"testing"
)

// TestCachePayload (no GPU): an image and its compile log come back from a
// cache entry's payload as they went in; entries of the layout before the
// log (kind byte, image) still read, with no log; a payload that lies
// about its log's length is refused.
func TestCachePayload(t *testing.T) {
	img := []byte("\x7fELF image bytes")
	for _, c := range []struct {
		cubin bool
		log   string
	}{{true, "ptxas warning : Potential Performance Loss: wgmma.mma_async instructions are serialized"}, {false, ""}, {true, ""}} {
		got, cubin, log, err := decodePayload(encodePayload(img, c.cubin, c.log))
		if err != nil || !bytes.Equal(got, img) || cubin != c.cubin || log != c.log {
			t.Fatalf("round trip of (cubin %v, log %q): %q %v %q %v", c.cubin, c.log, got, cubin, log, err)
		}
	}
	for kind, cubin := range map[byte]bool{imgPTX: false, imgCubin: true} {
		got, gotCubin, log, err := decodePayload(append([]byte{kind}, img...))
		if err != nil || !bytes.Equal(got, img) || gotCubin != cubin || log != "" {
			t.Fatalf("old layout %q: %q %v %q %v", kind, got, gotCubin, log, err)
		}
	}
	for _, p := range [][]byte{nil, {imgCubin}, {imgCubinLog, 1, 0}, {imgCubinLog, 9, 0, 0, 0, 'x', 'y'}, {imgCubinLog, 1, 0, 0, 0, 'x'}, {'Z', 1, 2}} {
		if _, _, _, err := decodePayload(p); err == nil {
			t.Fatalf("payload %q accepted", p)
		}
	}
}

// FuzzCachePayload: no payload makes decodePayload panic, and what it
// accepts encodes back to the same bytes (in the layout with a log).
func FuzzCachePayload(f *testing.F) {
	f.Add(encodePayload([]byte("img"), true, "log"))
	f.Add([]byte{imgPTX, 1, 2})
	f.Add([]byte{imgCubinLog, 0xff, 0xff, 0xff, 0xff, 1})
	f.Fuzz(func(t *testing.T, p []byte) {
		img, cubin, log, err := decodePayload(p)
		if err != nil {
			return
		}
		if len(img) == 0 {
			t.Fatal("accepted an empty image")
		}
		if p[0] == imgPTXLog || p[0] == imgCubinLog {
			if !bytes.Equal(encodePayload(img, cubin, log), p) {
				t.Fatalf("%q does not encode back", p)
			}
		}
	})
}
