package engine

import "strings"

// StopStrings scans streamed text for stop strings. Text that might be the
// start of a stop string is held back until it is known not to be, so the
// caller never shows text that a stop string later claims.
type StopStrings struct {
	stops   []string
	pending string
	stopped bool
}

// NewStopStrings watches for the given strings (empty ones are ignored).
func NewStopStrings(stops []string) *StopStrings {
	s := &StopStrings{}
	for _, x := range stops {
		if x != "" {
			s.stops = append(s.stops, x)
		}
	}
	return s
}

// Add takes the next piece of text and returns what may be shown, and
// whether a stop string has been seen (the stop string and anything after it
// are never returned).
func (s *StopStrings) Add(text string) (string, bool) {
	if s.stopped {
		return "", true
	}
	s.pending += text
	cut := -1
	for _, x := range s.stops {
		if i := strings.Index(s.pending, x); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut >= 0 {
		out := s.pending[:cut]
		s.pending, s.stopped = "", true
		return out, true
	}
	// Hold back the longest suffix that is a prefix of some stop string.
	hold := 0
	for _, x := range s.stops {
		for k := min(len(x)-1, len(s.pending)); k > hold; k-- {
			if strings.HasSuffix(s.pending, x[:k]) {
				hold = k
				break
			}
		}
	}
	out := s.pending[:len(s.pending)-hold]
	s.pending = s.pending[len(s.pending)-hold:]
	return out, false
}

// Pass takes the next piece of text without looking for stop strings in it
// (text generated before a request's min_tokens) and returns it with any
// text held back before it.
func (s *StopStrings) Pass(text string) string {
	if s.stopped {
		return ""
	}
	out := s.pending + text
	s.pending = ""
	return out
}

// Flush returns the held-back text once generation ends for another reason.
func (s *StopStrings) Flush() string {
	out := s.pending
	s.pending = ""
	return out
}
