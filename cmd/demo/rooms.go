package main

import (
	"fmt"
	"net/http"
	"regexp"
	"time"
)

// roomRE reads who served a room and which shard it is in from /rooms/<name>.
var roomRE = regexp.MustCompile(`served by (node-[0-9]+), owner of shard ([0-9]+)`)

// roomOwner asks node-i for room and returns the instance that served it and its shard
// ("" if the answer was not a room's).
func (d *demo) roomOwner(i int, room string) (owner, shard string) {
	a := d.request(http.MethodGet, i, "/rooms/"+room)
	m := roomRE.FindStringSubmatch(a.body)
	if a.status != 200 || m == nil {
		return "", ""
	}
	return m[1], m[2]
}

// agreedOwner waits until every running node sends room to one owner, and returns it.
func (d *demo) agreedOwner(room string, within time.Duration) (owner, shard string) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		owner, shard = "", ""
		agreed := true
		for i := 1; i <= nodeCount; i++ {
			if !d.running(i) {
				continue
			}
			o, s := d.roomOwner(i, room)
			if o == "" || (owner != "" && o != owner) {
				agreed = false
				break
			}
			owner, shard = o, s
		}
		if agreed && owner != "" {
			return owner, shard
		}
		time.Sleep(200 * time.Millisecond)
	}
	return "", ""
}

// rooms shows the shard set: every instance sends a room to the one owner of its shard.
func (d *demo) rooms() {
	d.note("/rooms/<name> is gated by a shard set of 8: each room's shard has one owner, and every")
	d.note("instance forwards the room's requests there.")
	for _, room := range []string{"lobby", "kitchen", "garden"} {
		owner, shard := d.agreedOwner(room, 10*time.Second)
		if owner == "" {
			d.fail(fmt.Sprintf("the instances did not agree on one owner of room %s within 10s", room), "node-1", "node-2", "node-3")
		}
		d.note(fmt.Sprintf("GET  /rooms/%-8s on every node -> 200  served by %s (shard %s)", room, owner, shard))
	}
	d.ok("every instance sends a room to the one owner of its shard")
}

// roomOf returns a room whose shard node-i owns now, "" if none of the first names tried is.
func (d *demo) roomOf(i int) string {
	for n := 1; n <= 40; n++ {
		room := fmt.Sprintf("room-%d", n)
		if owner, _ := d.agreedOwner(room, 2*time.Second); owner == nodeName(i) {
			return room
		}
	}
	return ""
}
