package elector

import (
	"testing"
	"time"
)

// TestRecordCodecDecodesWhatChanged: the codec decodes a value again only when its bytes
// changed, even when the store's driver hands it the same buffer rewritten in place.
func TestRecordCodecDecodesWhatChanged(t *testing.T) {
	a := Record{ID: "node-a", URL: "http://a:8080", Since: time.Unix(1, 0).UTC(), TTL: 2 * time.Second}
	b := Record{ID: "node-b", URL: "http://b:8080", Since: time.Unix(2, 0).UTC(), TTL: 2 * time.Second}
	encA, encB := a.encode(), b.encode()
	var c recordCodec
	buf := make([]byte, max(len(encA), len(encB)))
	for _, step := range []struct {
		name  string
		value func() []byte // called when the step runs: two steps share buf
		want  Record
	}{
		{"first_value", func() []byte { return encA }, a},
		{"the_same_bytes_again", func() []byte { return encA }, a},
		{"another_value", func() []byte { return encB }, b},
		{"a_buffer_holding_the_first", func() []byte { return append(buf[:0], encA...) }, a},
		{"the_same_buffer_rewritten_in_place", func() []byte { return append(buf[:0], encB...) }, b},
	} {
		t.Run(step.name, func(t *testing.T) {
			got, err := c.decode(step.value())
			if err != nil || got != step.want {
				t.Fatalf("decode = %+v, %v; want %+v", got, err, step.want)
			}
		})
	}
	t.Run("a_value_that_does_not_decode", func(t *testing.T) {
		if _, err := c.decode([]byte("{")); err == nil {
			t.Fatal("decode of a broken value succeeded")
		}
		if got, err := c.decode(encB); err != nil || got != b {
			t.Fatalf("decode after a broken value = %+v, %v; want %+v", got, err, b)
		}
	})
	t.Run("encode", func(t *testing.T) {
		for _, r := range []Record{a, a, b, a} {
			if got, want := string(c.encode(r)), string(r.encode()); got != want {
				t.Fatalf("encode(%s) = %s; want %s", r.ID, got, want)
			}
		}
	})
}
