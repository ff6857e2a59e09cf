package compile

import (
	"fmt"
	"sort"
)

// Bucket is one shape bucket: a plan built for it serves every step with at
// most Tokens tokens and at most Rows logit rows.
type Bucket struct{ Tokens, Rows int }

// Buckets lists the token counts plans are built for: small powers of two for
// decode batches, larger ones for prefill chunks. A step is served by the
// smallest bucket that holds it; prompts longer than the largest bucket are
// processed in chunks of that size.
type Buckets []int

// DefaultBuckets covers decode batches up to 256 and prefill chunks up to 512.
var DefaultBuckets = Buckets{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}

// Max is the largest token count a single step may hold.
func (bs Buckets) Max() int {
	if len(bs) == 0 {
		return 0
	}
	return bs[len(bs)-1]
}

// Validate checks that the list is non-empty, positive and increasing.
func (bs Buckets) Validate() error {
	if len(bs) == 0 {
		return fmt.Errorf("no shape buckets")
	}
	if !sort.IntsAreSorted(bs) || bs[0] <= 0 {
		return fmt.Errorf("shape buckets %v must be positive and increasing", bs)
	}
	for i := 1; i < len(bs); i++ {
		if bs[i] == bs[i-1] {
			return fmt.Errorf("shape buckets %v repeat %d", bs, bs[i])
		}
	}
	return nil
}

// For returns the bucket for a step of tokens tokens and rows logit rows.
func (bs Buckets) For(tokens, rows int) (Bucket, error) {
	if tokens <= 0 || rows < 0 || rows > tokens {
		return Bucket{}, fmt.Errorf("step of %d tokens with %d logit rows", tokens, rows)
	}
	t := bs.round(tokens)
	if t == 0 {
		return Bucket{}, fmt.Errorf("step of %d tokens exceeds the largest bucket %d", tokens, bs.Max())
	}
	r := 1
	if rows > 0 {
		r = bs.round(rows)
	}
	return Bucket{Tokens: t, Rows: r}, nil
}

// All lists every bucket a step can fall in: each token count with each
// row count up to it.
func (bs Buckets) All() []Bucket {
	var all []Bucket
	for i, t := range bs {
		for _, r := range bs[:i+1] {
			all = append(all, Bucket{Tokens: t, Rows: r})
		}
	}
	return all
}

func (bs Buckets) round(n int) int {
	for _, b := range bs {
		if b >= n {
			return b
		}
	}
	return 0
}
