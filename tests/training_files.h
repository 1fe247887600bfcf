// What the training end-to-end tests give the service: a small text corpus, a tiny LongNet's
// trainer config, and a job file for D x S ranks; and what they read back from a finished job.
// Shared by tests/training_e2e_test.cc and tests/chaos_e2e_test.cc.
#ifndef DATTN_TESTS_TRAINING_FILES_H_
#define DATTN_TESTS_TRAINING_FILES_H_

#include <map>
#include <string>
#include <vector>

#include "dattn/v1/job.pb.h"

namespace dattn::testing {

// About 200 KB of text with some structure to learn: numbered verses of a small vocabulary. The
// same bytes every time.
void WriteTestCorpus(const std::string& path);

// The trainer config (JSON) of a 2-layer, d = 32 LongNet on `corpus`: sequences of 64 bytes,
// batches of 4, one thread per rank (so that a run's losses are deterministic), `steps` steps, a
// checkpoint every `checkpoint_every` (3 kept), an evaluation every 20.
std::string TestTrainerConfig(const std::string& corpus, int steps, int checkpoint_every);

// Writes root/corpus.txt (once), root/NAME/trainer.json and root/NAME/job.yaml for `data` x
// `sequence` ranks on CPU workers (checkpoints to root/NAME/checkpoints when `checkpoints`);
// returns the job file's path.
std::string WriteTrainingJobFile(const std::string& root, const std::string& name, int data,
                                 int sequence, int steps, int checkpoint_every,
                                 bool checkpoints = true);

// The loss of every step of a finished training job (its result's curve).
std::vector<double> LossCurve(const dattn::v1::Job& job);

// How many "checkpoint" events announced each checkpoint ("step N" -> count).
std::map<std::string, int> CheckpointEventCounts(const dattn::v1::Job& job);

}  // namespace dattn::testing

#endif  // DATTN_TESTS_TRAINING_FILES_H_
