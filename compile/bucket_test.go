package compile

import (
	"testing"
)

func TestBucketsFor(t *testing.T) {
	bs := Buckets{1, 2, 4, 8, 16, 64}
	for _, tc := range []struct {
		tokens, rows int
		want         Bucket
		err          bool
	}{
		{1, 1, Bucket{1, 1}, false},
		{1, 0, Bucket{1, 1}, false}, // no logits still plans one row
		{2, 1, Bucket{2, 1}, false},
		{3, 1, Bucket{4, 1}, false},
		{3, 3, Bucket{4, 4}, false},
		{5, 2, Bucket{8, 2}, false},
		{9, 9, Bucket{16, 16}, false},
		{17, 5, Bucket{64, 8}, false},
		{64, 64, Bucket{64, 64}, false},
		{64, 0, Bucket{64, 1}, false},
		{0, 0, Bucket{}, true},
		{-1, 0, Bucket{}, true},
		{4, 5, Bucket{}, true},
		{4, -1, Bucket{}, true},
		{65, 1, Bucket{}, true},
		{1000, 1, Bucket{}, true},
	} {
		got, err := bs.For(tc.tokens, tc.rows)
		if tc.err {
			if err == nil {
				t.Errorf("For(%d, %d) = %+v, want an error", tc.tokens, tc.rows, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("For(%d, %d) = %+v, %v; want %+v", tc.tokens, tc.rows, got, err, tc.want)
		}
		if got.Tokens < tc.tokens || got.Rows < tc.rows || got.Rows > got.Tokens {
			t.Errorf("For(%d, %d) = %+v does not hold the step", tc.tokens, tc.rows, got)
		}
	}
	_, err := bs.For(65, 1)
	wantErr(t, err, "65", "largest bucket 64")
}

func TestBucketsForDefault(t *testing.T) {
	if err := DefaultBuckets.Validate(); err != nil {
		t.Fatal(err)
	}
	if DefaultBuckets.Max() != 512 {
		t.Errorf("Max = %d", DefaultBuckets.Max())
	}
	// Every step up to Max gets the smallest bucket that holds it.
	for n := 1; n <= DefaultBuckets.Max(); n++ {
		b, err := DefaultBuckets.For(n, 1)
		if err != nil {
			t.Fatalf("For(%d): %v", n, err)
		}
		smallest := 0
		for _, x := range DefaultBuckets {
			if x >= n {
				smallest = x
				break
			}
		}
		if b.Tokens != smallest {
			t.Errorf("For(%d) = %d tokens, want %d", n, b.Tokens, smallest)
		}
	}
}

func TestBucketsValidate(t *testing.T) {
	for _, tc := range []struct {
		bs   Buckets
		want string // "" for valid
	}{
		{Buckets{1}, ""},
		{Buckets{1, 2, 3, 100}, ""},
		{nil, "no shape buckets"},
		{Buckets{}, "no shape buckets"},
		{Buckets{2, 1}, "increasing"},
		{Buckets{1, 4, 2, 8}, "increasing"},
		{Buckets{0, 1}, "positive"},
		{Buckets{-4, 1}, "positive"},
		{Buckets{1, 2, 2, 4}, "repeat 2"},
	} {
		err := tc.bs.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("Validate(%v): %v", tc.bs, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("Validate(%v) accepted", tc.bs)
			continue
		}
		wantErr(t, err, tc.want)
	}
	if (Buckets{}).Max() != 0 || (Buckets{3, 9}).Max() != 9 {
		t.Errorf("Max wrong")
	}
}
