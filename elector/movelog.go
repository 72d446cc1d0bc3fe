package elector

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// A shard set's elections change leaders by the hundred when an instance joins or leaves,
// and a line per shard ("became leader", "leader changed") drowns everything else. So the
// elections of a set that share a MoveLog log their own term changes at DEBUG, and the
// MoveLog sums up each wave of moves in one INFO line: how many shards this instance took
// and from whom, how many it gave and to whom, how long the wave lasted and how many it
// owns now. A wave ends once no shard has moved for moveQuiet, or moveWaveMax after it
// began, so that a long wave still reports as it goes.

const (
	moveQuiet   = time.Second
	moveWaveMax = 10 * time.Second
)

// nobody stands for no instance in a summary: a shard taken while vacant, or given up
// before this instance saw who took it.
const nobody = "nobody"

// MoveLog sums up the moves of one shard set's shards on this instance (see above). The
// elections of the set share it; give it to each with Election.SetMoveLog.
type MoveLog struct {
	c      *Candidate
	set    string
	shards int

	mu    sync.Mutex
	owned int
	wave  *moveWave
	timer *time.Timer
}

// moveWave is the moves of one wave.
type moveWave struct {
	start, last time.Time
	from        map[string]int    // shards taken, by the instance that held each before
	expired     map[string]int    // keys of silent leaders this instance deleted, by leader
	gaveTo      map[string]string // shards given, by election: to whom, nobody until seen
}

// MoveLog returns the candidate's MoveLog of the shard set named set, of count shards,
// creating it on first use: one per set and count for as long as the candidate lives, so
// that what it owns is counted across config reloads.
func (c *Candidate) MoveLog(set string, count int) *MoveLog {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := moveLogKey{set, count}
	m, ok := c.moveLogs[key]
	if !ok {
		m = &MoveLog{c: c, set: set, shards: count}
		if c.moveLogs == nil {
			c.moveLogs = map[moveLogKey]*MoveLog{}
		}
		c.moveLogs[key] = m
	}
	return m
}

// moveLogKey names a candidate's MoveLog.
type moveLogKey struct {
	set   string
	count int
}

// SetMoveLog makes the election one of the shard set that l sums up: its own term changes
// go to DEBUG and its moves into l's summaries. Call it before Start.
func (e *Election) SetMoveLog(l *MoveLog) { e.moveLog.Store(l) }

// logMove logs a line about one of the election's own moves: at INFO for a plain
// election, at DEBUG for a shard, whose set's MoveLog sums its moves up.
func (e *Election) logMove(msg string, fields ...zap.Field) {
	level := zap.InfoLevel
	if e.moveLog.Load() != nil {
		level = zap.DebugLevel
	}
	if ce := e.c.log().Check(level, msg); ce != nil {
		ce.Write(fields...)
	}
}

// took records that this instance became the leader of election, after from.
func (m *MoveLog) took(from string) {
	m.note(func(w *moveWave) {
		if from == "" {
			from = nobody
		}
		w.from[from]++
		m.owned++
	})
}

// gave records that this instance let go of election, to to ("" when not known yet).
func (m *MoveLog) gave(election, to string) {
	m.note(func(w *moveWave) {
		w.gaveTo[election] = to
		m.owned--
	})
}

// expired records that this instance deleted the key of leader, silent for a whole ttl: a
// sign of trouble on that instance, which the summary keeps.
func (m *MoveLog) expired(leader string) {
	m.note(func(w *moveWave) { w.expired[leader]++ })
}

// ledBy records that another instance, to, leads election now: the taker of a shard this
// instance gave in the current wave, if it did not know it yet.
func (m *MoveLog) ledBy(election, to string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if w := m.wave; w != nil && to != "" {
		if was, ok := w.gaveTo[election]; ok && was == "" {
			w.gaveTo[election] = to
		}
	}
}

// note applies a move to the current wave, starting one if none is under way, and sets
// the wave's end.
func (m *MoveLog) note(move func(*moveWave)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if m.wave == nil {
		m.wave = &moveWave{start: now, from: map[string]int{}, expired: map[string]int{}, gaveTo: map[string]string{}}
	}
	m.wave.last = now
	move(m.wave)
	end := min(moveQuiet, m.wave.start.Add(moveWaveMax).Sub(now))
	if m.timer == nil {
		m.timer = time.AfterFunc(end, m.flush)
	} else {
		m.timer.Reset(end)
	}
}

// flush logs the current wave, if any, and ends it.
func (m *MoveLog) flush() {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.wave
	if w == nil {
		return
	}
	m.wave = nil
	gaveTo := map[string]int{}
	for _, to := range w.gaveTo {
		if to == "" {
			to = nobody
		}
		gaveTo[to]++
	}
	took := 0
	for _, n := range w.from {
		took += n
	}
	fields := []zap.Field{zap.String("set", m.set),
		zap.Int("took", took), zap.Any("took_from", w.from),
		zap.Int("gave", len(w.gaveTo)), zap.Any("gave_to", gaveTo),
		zap.Duration("in", w.last.Sub(w.start).Round(time.Millisecond)),
		zap.Int("owns", m.owned), zap.Int("shards", m.shards)}
	if len(w.expired) > 0 {
		fields = append(fields, zap.Any("expired_silent_leaders", w.expired))
	}
	m.c.log().Info("shard set moved shards", fields...)
}
