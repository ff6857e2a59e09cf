package loadgen

import (
	"fmt"
	"math"
	"strings"

	"github.com/BurntSushi/toml"
)

// Budget is a set of targets a load test must meet (TOML; absent keys are
// not checked, unknown keys are an error).
type Budget struct {
	P99TTFTms           *float64 `toml:"p99_ttft_ms"`
	P99ITLms            *float64 `toml:"p99_itl_ms"`
	P99TPOTms           *float64 `toml:"p99_tpot_ms"`
	P99E2Ems            *float64 `toml:"p99_e2e_ms"`
	MinOutputTokensPerS *float64 `toml:"min_output_tokens_per_s"`
	MinRequestsPerS     *float64 `toml:"min_requests_per_s"`
	MaxErrorRate        *float64 `toml:"max_error_rate"`
	MinGoodput          *float64 `toml:"min_goodput"` // requests per second meeting the SLO
	MaxCostPer1kTokens  *float64 `toml:"max_cost_per_1k_tokens"`
	SLOTTFTms           float64  `toml:"slo_ttft_ms"` // what goodput counts
	SLOTPOTms           float64  `toml:"slo_tpot_ms"`
}

// ParseBudget reads a budget file's text.
func ParseBudget(text string) (*Budget, error) {
	var b Budget
	if err := DecodeBudget(text, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// DecodeBudget decodes a TOML budget into v; a key v has no field for is an
// error, so that a misspelled target cannot go unchecked.
func DecodeBudget(text string, v any) error {
	md, err := toml.Decode(text, v)
	if err != nil {
		return fmt.Errorf("budget: %w", err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		var keys []string
		for _, k := range und {
			keys = append(keys, k.String())
		}
		return fmt.Errorf("budget: unknown keys %s", strings.Join(keys, ", "))
	}
	return nil
}

// Verdict is one target against its measurement.
type Verdict struct {
	Name     string  `json:"name"`
	Target   float64 `json:"target"`
	Measured float64 `json:"measured"`
	OK       bool    `json:"ok"`
}

// Check compares s with the budget's targets, in a fixed order.
func (b *Budget) Check(s Summary) []Verdict {
	var out []Verdict
	atMost := func(name string, target *float64, v float64) {
		if target != nil {
			out = append(out, Verdict{name, *target, v, !math.IsNaN(v) && v <= *target})
		}
	}
	atLeast := func(name string, target *float64, v float64) {
		if target != nil {
			out = append(out, Verdict{name, *target, v, !math.IsNaN(v) && v >= *target})
		}
	}
	atMost("p99_ttft_ms", b.P99TTFTms, s.TTFT.P99)
	atMost("p99_itl_ms", b.P99ITLms, s.ITL.P99)
	atMost("p99_tpot_ms", b.P99TPOTms, s.TPOT.P99)
	atMost("p99_e2e_ms", b.P99E2Ems, s.E2E.P99)
	atLeast("min_output_tokens_per_s", b.MinOutputTokensPerS, s.OutputTokensPerS)
	atLeast("min_requests_per_s", b.MinRequestsPerS, s.RequestsPerS)
	atMost("max_error_rate", b.MaxErrorRate, s.ErrorRate)
	atLeast("min_goodput", b.MinGoodput, s.GoodputPerS)
	cost := s.CostPer1kTokens
	if cost == 0 {
		cost = math.NaN() // no price given: the target cannot be met
	}
	atMost("max_cost_per_1k_tokens", b.MaxCostPer1kTokens, cost)
	return out
}
