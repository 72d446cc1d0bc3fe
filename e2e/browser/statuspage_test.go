//go:build unix

package browser

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// watchScript records in the page when it last began to show each thing: the leader
// ("leader:c1"), a store problem ("store-problem"), its end ("store-healed") and each
// ended term with how it ended ("crashed:7", "transferred:5"), as Date.now() values in
// window.shown. The browser's
// clock and the test's are the same machine's, so a change's delay to the page is the
// difference between when the test saw the change and when the page showed it.
const watchScript = `(() => {
  window.shown = {};
  window.violations = [];
  document.addEventListener("securitypolicyviolation", e => window.violations.push(e.violatedDirective + " " + e.blockedURI));
  let leader = null, problem = false;
  const note = () => {
    const now = Date.now();
    const l = document.querySelector("[data-leader]");
    if (l && l.textContent !== leader) { leader = l.textContent; window.shown["leader:" + leader] = now; }
    const p = !!document.querySelector(".store-problem");
    if (p !== problem) { problem = p; window.shown[p ? "store-problem" : "store-healed"] = now; }
    document.querySelectorAll("g.term[data-ended]").forEach(g => { const k = g.dataset.ended + ":" + g.dataset.term; if (!(k in window.shown)) window.shown[k] = now; });
  };
  note();
  new MutationObserver(note).observe(document.getElementById("live"), {childList: true, subtree: true});
  return true;
})()`

// shownAt waits until the page has recorded key at since or later, and returns when.
func shownAt(t *testing.T, tab context.Context, key string, since time.Time) time.Time {
	t.Helper()
	deadline := time.Now().Add(showTimeout)
	for {
		ms := get(t, tab, "reading window.shown", chromedp.Evaluate[float64](fmt.Sprintf(`window.shown[%q] || 0`, key)))
		if at := time.UnixMilli(int64(ms)); !at.Before(since.Truncate(time.Millisecond)) {
			return at
		}
		if time.Now().After(deadline) {
			html := get(t, tab, "reading the page", chromedp.OuterHTML("#live"))
			t.Fatalf("the page did not show %s within %v; it shows:\n%s", key, showTimeout, html)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitText waits until the text of the element sel satisfies ok, and returns it.
func waitText(t *testing.T, tab context.Context, sel string, ok func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(showTimeout)
	for {
		text := get(t, tab, "reading "+sel, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ""`, sel)))
		if ok(text) {
			return text
		}
		if time.Now().After(deadline) {
			url := get(t, tab, "reading the URL", chromedp.Evaluate[string](`location.href`))
			t.Fatalf("%s at %s reads %q after %v", sel, url, text, showTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// firstEventSize reads the event stream at url up to its first update and returns the
// size of that event.
func firstEventSize(t *testing.T, url string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), showTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("%s: Content-Type %q", url, ct)
	}
	r := bufio.NewReader(resp.Body)
	size, inUpdate := 0, false
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		if line == "event: update\n" {
			inUpdate = true
		}
		if inUpdate {
			size += len(line)
			if line == "\n" {
				return size
			}
		}
	}
}

// seenBy polls in's /whoami until its leader is not from (or is to, when set) and returns
// when it first saw that, and the leader and token it saw.
func seenBy(t *testing.T, in *fleet.Instance, change func(fleet.Whoami) bool, within time.Duration) (time.Time, fleet.Whoami) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if w, err := in.Whoami(); err == nil && change(w) {
			return time.Now(), w
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not see the change within %v", in.ID, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStatusPage opens the status page of a follower in headless Chromium and follows a
// three-instance fleet on etcd through a transfer (made with the admin page's button), a
// SIGKILL of the leader and the follower's own link to the store being cut. It logs the
// page's size and each change's delay to the page, and takes the screenshots for docs/.
func TestStatusPage(t *testing.T) {
	ctx := newBrowser(t)
	f := startPageFleet(t, 3, fleet.Config{})
	leader, token := fleet.WaitStableLeader(t, f.instances, electTimeout)
	others := fleet.Others(f.instances, leader)
	watcher, target := others[0], others[1]
	t.Logf("leader %s (term %d); the page of %s watches; transfer to %s", leader.ID, token, watcher.ID, target.ID)

	pageURL := watcher.URL() + "/status"
	resp, err := http.Get(pageURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `<b data-leader>`+leader.ID+`</b>`) {
		t.Fatalf("GET %s: %d, the leader %s not on it:\n%s", pageURL, resp.StatusCode, leader.ID, body)
	}
	t.Logf("MEASURED page load: %d bytes in one response (HTML with inline style and script; 2 elections, 3 candidates each; %s)", len(body), resp.Header.Get("Content-Type"))
	t.Logf("MEASURED one live update: %d bytes (an event of the stream)", firstEventSize(t, pageURL+"?events"))

	t.Run("without_javascript_the_page_is_plain_tables_and_the_timeline", func(t *testing.T) {
		tab := newTab(t, ctx)
		do(t, tab, "loading the page without scripts", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
			return err
		}), chromedp.Navigate(pageURL))
		leaderText := get(t, tab, "reading the leader", chromedp.Text("[data-leader]"))
		// The page's own script would have set this on its first update.
		if updated := get(t, tab, "reading data-updated", chromedp.Evaluate[string](`document.body.dataset.updated || ""`)); updated != "" {
			t.Errorf("scripts ran although disabled (data-updated=%s)", updated)
		}
		candidates := get(t, tab, "counting candidates", chromedp.Evaluate[int](`document.querySelectorAll('section[data-election="default"] table.candidates tbody tr').length`))
		bars := get(t, tab, "counting term bars", chromedp.Evaluate[int](`document.querySelectorAll("svg.timeline g.term").length`))
		refresh := get(t, tab, "reading the refresh", chromedp.Evaluate[bool](`!!document.querySelector('noscript')`))
		if leaderText != leader.ID || candidates != 3 || bars < 1 || !refresh {
			t.Errorf("without scripts: leader %q, %d candidate rows, %d term bars; want %s, 3, at least 1", leaderText, candidates, bars, leader.ID)
		}
	})

	tab := newTab(t, ctx)
	do(t, tab, "loading the page", chromedp.Navigate(pageURL), chromedp.WaitVisible("[data-leader]"))
	get(t, tab, "watching the page", chromedp.Evaluate[bool](watchScript))
	transferred := get(t, tab, "reading the navigation's size", chromedp.Evaluate[float64](`performance.getEntriesByType("navigation")[0].transferSize`))
	resources := get(t, tab, "listing the page's resources", chromedp.Evaluate[[]string](`performance.getEntriesByType("resource").map(r => r.name).filter(n => !n.endsWith("?events"))`))
	if len(resources) != 0 {
		t.Errorf("the page loaded %q besides its event stream; it should need nothing", resources)
	}
	// The page's Content-Security-Policy admits its own inline style (and script: the page
	// goes on updating below).
	if color := get(t, tab, "reading the leader's colour", chromedp.Evaluate[string](`getComputedStyle(document.querySelector("dd.leader b")).color`)); color != "rgb(47, 125, 79)" {
		t.Errorf("the leader's name is %s, not the style's green: the inline style did not apply", color)
	}
	t.Logf("MEASURED page load in Chromium: %.0f bytes transferred (navigation entry); no other request but the event stream", transferred)
	shownAt(t, tab, "leader:"+leader.ID, time.Time{})
	// Every election is on the page, each with a leader of its own.
	waitText(t, tab, fmt.Sprintf(`section[data-election=%q] [data-leader]`, secondElection), func(s string) bool { return strings.HasPrefix(s, "c") })
	if n := get(t, tab, "counting the elections", chromedp.Evaluate[int](`document.querySelectorAll("section.election").length`)); n != 2 {
		t.Errorf("the page shows %d elections, want 2 (default and %s)", n, secondElection)
	}

	// The transfer, made on the admin API's page: reached by following the page's link
	// (Caddy's admin endpoint wants the origin the browser comes from), then its button.
	admin := newTab(t, ctx)
	do(t, admin, "opening the admin page through the link",
		chromedp.Navigate(pageURL), chromedp.WaitVisible("[data-admin-link]"), chromedp.Click("[data-admin-link]", chromedp.NodeVisible),
		chromedp.WaitVisible(fmt.Sprintf(`button[data-transfer=%q]`, target.ID)))
	adminLeader := get(t, admin, "reading the admin page", chromedp.Text("[data-leader]"))
	if adminLeader != leader.ID {
		t.Fatalf("the admin page shows leader %q, want %s", adminLeader, leader.ID)
	}
	clicked := time.Now()
	do(t, admin, "clicking transfer", chromedp.Click(fmt.Sprintf(`button[data-transfer=%q]`, target.ID), chromedp.NodeVisible))
	changed, w := seenBy(t, watcher, func(w fleet.Whoami) bool { return w.Leader == target.ID }, showTimeout)
	shown := shownAt(t, tab, "leader:"+target.ID, clicked)
	t.Logf("MEASURED transfer %s -> %s: on the page %v after %s saw it", leader.ID, target.ID, shown.Sub(changed).Round(time.Millisecond), watcher.ID)
	result := waitText(t, admin, "#result", func(s string) bool { return s != "" && !strings.HasPrefix(s, "Sending") })
	if !strings.HasPrefix(result, "200: ") || !strings.Contains(result, `"leader":"`+target.ID+`"`) {
		t.Errorf("the admin page says %q after the transfer", result)
	}
	// The ended term shows in the timeline, as transferred, once the successor has
	// recorded it; the table of ended terms says so too.
	shownAt(t, tab, "transferred:"+strconv.FormatInt(token, 10), clicked)
	do(t, tab, "waiting for the transferred term", chromedp.WaitVisible(fmt.Sprintf(`g.term-transfer[data-term="%d"]`, token)))
	if ended := get(t, tab, "reading how the term ended", chromedp.Text(fmt.Sprintf(`tr[data-past-term="%d"] td[data-ended]`, token), chromedp.NodeReady)); ended != "transferred" {
		t.Errorf("the table of ended terms says term %d ended %q, want transferred", token, ended)
	}

	// Every candidate's own word on its failsafe state and its link to the store: the
	// watcher's page asks each peer's page for it. The first leader, a follower since the
	// transfer, is cut off from etcd: it says so, and the watcher's page shows it, even
	// once its registry entry has run out with its lease (it is then shown as gone).
	third := leader
	storeCell := fmt.Sprintf(`section[data-election="default"] tr[data-candidate=%q] td[data-store]`, third.ID)
	waitText(t, tab, storeCell, freshlyReachable)
	if fs := get(t, tab, "reading a peer's failsafe state", chromedp.Text(fmt.Sprintf(`section[data-election="default"] tr[data-candidate=%q] td[data-failsafe]`, third.ID))); fs != "off" {
		t.Errorf("%s's failsafe state reads %q on the page, want off (the fleet runs without failsafe)", third.ID, fs)
	}
	f.links[third.ID].Blackhole()
	peerCut := time.Now()
	said := waitText(t, tab, storeCell, func(s string) bool { return strings.HasPrefix(s, "unreachable, it says: “cannot reach the store") })
	t.Logf("MEASURED %s cut off from etcd: %s's page shows it, in %s's own words, %v after the cut: %q",
		third.ID, watcher.ID, third.ID, time.Since(peerCut).Round(time.Millisecond), said)
	waitText(t, tab, fmt.Sprintf(`section[data-election="default"] tr[data-candidate=%q].gone td[data-store]`, third.ID),
		func(s string) bool { return strings.HasPrefix(s, "unreachable, it says: “cannot reach the store") })
	writeScreenshot(t, "status-page-peer-cut.png", get(t, tab, "screenshot of the page with a peer cut off", chromedp.FullScreenshot(100)))
	f.links[third.ID].Heal()
	waitText(t, tab, fmt.Sprintf(`section[data-election="default"] tr[data-candidate=%q].follower td[data-store]`, third.ID),
		freshlyReachable)

	// SIGKILL of the new leader: the page shows who takes over, and the killed term as
	// crashed (its successor waited out its deadline without a word from it).
	killedToken := w.Token
	target.Signal(syscall.SIGKILL)
	killedAt := time.Now()
	changed, w = seenBy(t, watcher, func(w fleet.Whoami) bool { return w.Leader != "" && w.Leader != target.ID }, showTimeout)
	shown = shownAt(t, tab, "leader:"+w.Leader, killedAt)
	t.Logf("MEASURED SIGKILL of %s: %s leads %v after the kill; on the page %v after %s saw it",
		target.ID, w.Leader, changed.Sub(killedAt).Round(time.Millisecond), shown.Sub(changed).Round(time.Millisecond), watcher.ID)
	recorded := shownAt(t, tab, elector.EndedCrashed+":"+strconv.FormatInt(killedToken, 10), killedAt)
	if n := get(t, tab, "finding the crashed term's bar", chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll('g.term-crash[data-term="%d"]').length`, killedToken))); n != 1 {
		t.Errorf("the killed term %d is not drawn as crashed", killedToken)
	}
	// The time nobody led, from the killed term's end to its successor's start, is a band.
	if gaps := get(t, tab, "counting the leaderless gaps", chromedp.Evaluate[int](`document.querySelectorAll("svg.timeline rect.gap").length`)); gaps < 1 {
		t.Errorf("the timeline shows no time without a leader after a SIGKILL of the leader")
	}
	t.Logf("MEASURED the killed term %d shows as crashed %v after the new leader did", killedToken, recorded.Sub(shown).Round(time.Millisecond))
	// The killed instance does not answer the watcher's page: it is shown unreachable.
	waitText(t, tab, fmt.Sprintf(`section[data-election="default"] tr[data-candidate=%q] td[data-store]`, target.ID),
		func(s string) bool { return strings.HasPrefix(s, "unreachable: no answer") })

	writeScreenshot(t, "status-page.png", get(t, tab, "screenshot of the page", chromedp.FullScreenshot(100)))
	do(t, admin, "reloading the admin page", chromedp.Reload(), chromedp.WaitVisible("[data-resign]"))
	writeScreenshot(t, "status-page-admin.png", get(t, admin, "screenshot of the admin page", chromedp.FullScreenshot(100)))

	// The watcher's own link to etcd goes silent: its page says so.
	f.links[watcher.ID].Blackhole()
	cut := time.Now()
	shown = shownAt(t, tab, "store-problem", cut)
	problem := get(t, tab, "reading the store problem", chromedp.Text(".store-problem"))
	t.Logf("MEASURED store cut off: the page says so %v after the cut: %q", shown.Sub(cut).Round(time.Millisecond), problem)
	if !strings.Contains(problem, "store") {
		t.Errorf("the store problem reads %q", problem)
	}
	// The history read last goes on showing while the store does not answer.
	if n := get(t, tab, "counting the ended terms", chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll('g.term-transfer[data-term="%d"], g.term-crash[data-term="%d"]').length`, token, killedToken))); n != 2 {
		t.Errorf("with the store cut off the timeline shows %d of the 2 ended terms", n)
	}
	writeScreenshot(t, "status-page-store-cut.png", get(t, tab, "screenshot of the cut-off page", chromedp.FullScreenshot(100)))
	f.links[watcher.ID].Heal()
	healed := time.Now()
	shown = shownAt(t, tab, "store-healed", healed)
	t.Logf("MEASURED store back: the problem left the page %v after the link healed", shown.Sub(healed).Round(time.Millisecond))
	if v := get(t, tab, "reading the policy violations", chromedp.Evaluate[[]string](`window.violations`)); len(v) != 0 {
		t.Errorf("the page broke its own Content-Security-Policy: %q", v)
	}
}

// freshlyReachable says whether a peer's store cell reads as a fresh answer (taken within
// the page's refresh) in which the peer says it reaches the store.
func freshlyReachable(s string) bool {
	return strings.HasPrefix(s, "answer taken ") && strings.Contains(s, "): reachable, lease confirmed ")
}
